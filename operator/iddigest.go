package operator

import (
	"crypto/sha256"
	"encoding/base64"
)

// MaxKeyID is the length, in bytes, above which an identifier is never
// held whole in a Redis key of the ratelimit Limiters: the keys hold its
// digest ([IDDigest]). An identifier of at most MaxKeyID bytes may be
// held whole (escaped) or, if escaping makes it longer than MaxKeyID, by
// its digest too.
const MaxKeyID = 128

// IDDigest returns the digest that stands for id in the Redis keys when
// id is longer than [MaxKeyID] bytes: '#' and the unpadded base64url
// SHA-256 of id, 44 bytes. It returns "" for an identifier of at most
// MaxKeyID bytes, whose keys may hold it whole. id is the identifier as a
// limit's Key gives it (for a Compose key, its escaped and joined parts)
// or as ratelimit.Limiter.Allow is given it, which is what an
// observer's Denial hook is told. ratelimit.Inspector's Status and Reset
// take a long identifier by its digest, so that a tool (the admin page)
// need not keep the identifier itself.
func IDDigest(id string) string {
	if len(id) <= MaxKeyID {
		return ""
	}
	sum := sha256.Sum256([]byte(id))
	return string(base64.RawURLEncoding.AppendEncode([]byte{'#'}, sum[:]))
}
