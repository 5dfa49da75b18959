package ratelimit

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"

	"github.com/slidinglog/ratelimit/internal/slidinglog"
)

// MaxKeyID is the length, in bytes, above which an identifier is never
// held whole in a Redis key: the keys hold its digest ([IDDigest]). An
// identifier of at most MaxKeyID bytes may be held whole (escaped) or,
// if escaping makes it longer than MaxKeyID, by its digest too.
const MaxKeyID = maxIDLen

// IDDigest returns the digest that stands for id in the Redis keys when
// id is longer than [MaxKeyID] bytes: '#' and the unpadded base64url
// SHA-256 of id, 44 bytes. It returns "" for an identifier of at most
// MaxKeyID bytes, whose keys may hold it whole. id is the identifier as a
// limit's [Key] gives it (for a [Compose] key, its escaped and joined
// parts) or as [Limiter.Allow] is given it, which is what a
// [DenialObserver] is told. [Limiter.LimitStatusDigest] and
// [Limiter.ResetLimitDigest] address a long identifier by its digest, so
// that a tool need not keep the identifier itself.
func IDDigest(id string) string {
	if len(id) <= maxIDLen {
		return ""
	}
	sum := sha256.Sum256([]byte(id))
	return string(base64.RawURLEncoding.AppendEncode([]byte{hashMark}, sum[:]))
}

// digestLen is the length of IDDigest's digests.
var digestLen = 1 + base64.RawURLEncoding.EncodedLen(sha256.Size)

// checkDigest reports whether d has the form of IDDigest's digests.
func checkDigest(d string) error {
	if len(d) != digestLen || d[0] != hashMark {
		return fmt.Errorf("ratelimit: %q is not an identifier digest ('#' and 43 base64url characters)", d)
	}
	if _, err := base64.RawURLEncoding.DecodeString(d[1:]); err != nil {
		return fmt.Errorf("ratelimit: %q is not an identifier digest: %w", d, err)
	}
	return nil
}

// LimitStatusDigest is [Limiter.LimitStatus] for the identifier whose
// digest ([IDDigest]) is digest: the state of the limit called name for
// it, counting nothing. It fails as LimitStatus does, and for a digest
// not of IDDigest's form. The plan of a limit with plans ([Plans]) and a
// manual block ([Operator.Block]) are looked up by the digest, which
// names no plan and no block: the result is the default plan's, as if not
// blocked.
func (l *Limiter) LimitStatusDigest(ctx context.Context, name, digest string) (LimitResult, error) {
	if err := checkDigest(digest); err != nil {
		return LimitResult{}, err
	}
	d, i := l.limitNamed(name)
	if d == nil {
		return LimitResult{}, fmt.Errorf("ratelimit: no limit named %q", name)
	}
	s := getScratch()
	defer s.put()
	for range d.limits {
		s.ids = append(s.ids, digest) // the other limits are read, never counted
	}
	s.digests = true
	res, err := d.decide(ctx, s, 1, false, true)
	if err != nil {
		return LimitResult{}, err
	}
	return res.Limits[i], nil
}

// ResetLimitDigest is [Limiter.ResetLimit] for the identifier whose
// digest ([IDDigest]) is digest: it forgets everything the limit called
// name counted for it, and lifts the limit's block of it ([Limit.Block]).
// It fails as ResetLimit does, and for a digest not of IDDigest's form.
func (l *Limiter) ResetLimitDigest(ctx context.Context, name, digest string) error {
	if err := checkDigest(digest); err != nil {
		return err
	}
	s := getScratch()
	defer s.put()
	s.digests = true
	d, i, log, err := l.limitLog(s, name, digest)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.timeout)
	defer cancel()
	req := slidinglog.AppendRequest(nil, 0, 1, d.spec.Limits[i].Lua)
	err = d.forget(ctx, i, log.Key, req)
	d.denies.Forget(log)
	if err != nil {
		return fmt.Errorf("ratelimit: reset %s: %w", name, err)
	}
	return nil
}
