package ratelimit

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// Redis keys have the form
//
//	<prefix><limit name>:<kind>:{<identifier>}
//
// for an exact log, and <prefix>:<kind>:{<identifier>} for the hash that
// holds the bucketed limits of an identifier (the name, empty, is in the
// hash's fields). The kind is what the limit's Key counts by (see
// Key.kindOf: "ip", "header.X-Api-Key", "user", "ip+route", "fn.tenant"),
// so that two limits of one name whose keys count different things (a
// header's value and a client address that spell the same) never share a
// log. It is escaped (appendKind) to hold no ':', '{' or '}', and a name
// holds none either, so the parts are told apart: no two (name, kind) give
// one head, no bucketed head is an exact log's, and no head is that of a
// key without a kind (<prefix><limit name>:{ or <prefix>{), which another
// version of the library may have left in the same Redis.
//
// The identifier is escaped so that it holds no '{' or '}' of its own: the
// braces around it are the key's only hash tag, so the library, not the
// client, decides the Redis Cluster slot, and every limit counted by the same
// identifier lands in the same slot. Escaping is injective (distinct
// identifiers stay distinct) and long identifiers are replaced by a digest.

const (
	// maxIDLen bounds the escaped identifier in a Redis key; longer ones are
	// replaced by hashMark and the base64url SHA-256 of the raw identifier.
	maxIDLen = 128
	// hashMark starts a digest identifier. appendEscaped always escapes it, so a
	// digest never equals an escaped identifier.
	hashMark = '#'
	// composeSep joins the escaped parts of a Compose key. appendEscaped always
	// escapes it, so the parts can be told apart.
	composeSep = '|'
)

// safe[c] is true for the bytes appendEscaped keeps as they are.
var safe = byteSet("-._~:/@!$&'()*+,;=[]<>?^`\"")

// byteSet returns the set of the letters, the digits and the bytes of
// extra.
func byteSet(extra string) (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for i := 0; i < len(extra); i++ {
		t[extra[i]] = true
	}
	return t
}

const hexDigits = "0123456789ABCDEF"

// appendEscaped appends id to dst, percent-encoding every byte outside the
// safe set, including '%', '{', '}', hashMark, composeSep, spaces, control
// bytes and non-ASCII.
func appendEscaped(dst []byte, id string) []byte {
	for i := 0; i < len(id); i++ {
		c := id[i]
		if safe[c] {
			dst = append(dst, c)
		} else {
			dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&15])
		}
	}
	return dst
}

// unescapeID returns id as it was before appendEscaped escaped it: id
// itself when it holds no '%', as a client address never does. A '%'
// not followed by two hex digits, which appendEscaped never writes, is
// kept as it is.
func unescapeID(id string) string {
	i := strings.IndexByte(id, '%')
	if i < 0 {
		return id
	}
	b := make([]byte, 0, len(id))
	b = append(b, id[:i]...)
	for ; i < len(id); i++ {
		if c := id[i]; c == '%' && i+2 < len(id) && isHex(id[i+1]) && isHex(id[i+2]) {
			b = append(b, unhex(id[i+1])<<4|unhex(id[i+2]))
			i += 2
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' || 'a' <= c && c <= 'f' }

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// escapedLen is the length of id escaped, without building it.
func escapedLen(id string) int {
	n := len(id)
	for i := 0; i < len(id); i++ {
		if !safe[id[i]] {
			n += 2
		}
	}
	return n
}

// appendKey appends the Redis key for id to dst, where head is keyHead's
// ("<prefix><limit name>:<kind>:{"). If escaped, id is known to hold only bytes
// appendEscaped keeps (and composeSep), as Compose's identifiers do, and is not
// escaped again.
func appendKey(dst []byte, head, id string, escaped bool) []byte {
	dst = append(dst, head...)
	n := len(id)
	if !escaped {
		n = escapedLen(id)
	}
	if n > maxIDLen {
		sum := sha256.Sum256([]byte(id))
		dst = append(dst, hashMark)
		dst = base64.RawURLEncoding.AppendEncode(dst, sum[:])
	} else if escaped {
		dst = append(dst, id...)
	} else {
		dst = appendEscaped(dst, id)
	}
	return append(dst, '}')
}

// kindSafe[c] is true for the bytes appendKind keeps as they are: those of
// a limit name, and the '+' that joins a Compose key's parts.
var kindSafe = byteSet("-_.+")

// appendKind appends kind to dst, percent-encoding every byte outside
// letters, digits and "-_.+" (so ':', '{', '}' and '%' among them).
func appendKind(dst []byte, kind string) []byte {
	for i := 0; i < len(kind); i++ {
		c := kind[i]
		if kindSafe[c] {
			dst = append(dst, c)
		} else {
			dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&15])
		}
	}
	return dst
}

// keyHead returns the head of the Redis keys of a limit named name whose
// Key is of kind, under prefix (with redisstore.Options.SingleSlot's hash tag, if any):
// what appendKey completes with the identifier. A bucketed limit's head
// has no name (its identifier's bucketed limits of one kind share one
// hash).
func keyHead(prefix, name, kind string, bucketed bool) string {
	b := []byte(prefix)
	if !bucketed {
		b = append(b, name...)
	}
	b = append(b, ':')
	b = appendKind(b, kind)
	return string(append(b, ":{"...))
}
