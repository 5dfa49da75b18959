package ratelimit

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"

	"github.com/slidinglog/ratelimit/operator"
)

// The keys hold an identifier whole up to operator.MaxKeyID bytes, as
// operator.IDDigest says: this fails to compile if they disagree.
const _ = uint(maxIDLen-operator.MaxKeyID) + uint(operator.MaxKeyID-maxIDLen) + uint(hashMark-'#') + uint('#'-hashMark)

// digestLen is the length of operator.IDDigest's digests.
var digestLen = 1 + base64.RawURLEncoding.EncodedLen(sha256.Size)

// checkDigest reports whether d has the form of operator.IDDigest's digests.
func checkDigest(d string) error {
	if len(d) != digestLen || d[0] != hashMark {
		return fmt.Errorf("ratelimit: %q is not an identifier digest ('#' and 43 base64url characters)", d)
	}
	if _, err := base64.RawURLEncoding.DecodeString(d[1:]); err != nil {
		return fmt.Errorf("ratelimit: %q is not an identifier digest: %w", d, err)
	}
	return nil
}

// limitStatusDigest is [Inspector.Status] for the identifier whose
// digest ([operator.IDDigest]) is digest: the state of the limit called name for
// it, counting nothing. It fails as limitStatus does, and for a digest
// not of operator.IDDigest's form. The plan of a limit with plans ([Plans]) and a
// manual block ([operator.Operator.Block]) are looked up by the digest, which
// names no plan and no block: the result is the default plan's, as if not
// blocked.
func (l *Limiter) limitStatusDigest(ctx context.Context, name, digest string) (LimitResult, error) {
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

// resetLimitDigest is [Inspector.Reset] for the identifier whose
// digest ([operator.IDDigest]) is digest: it forgets everything the limit called
// name counted for it, and lifts the limit's block of it ([Limit.Block]).
// It fails as resetLimit does, and for a digest not of operator.IDDigest's form.
func (l *Limiter) resetLimitDigest(ctx context.Context, name, digest string) error {
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
	err = d.forget(ctx, i, log.Key, d.forgetRequest(i))
	d.l.denies.Forget(log)
	if err != nil {
		return fmt.Errorf("ratelimit: reset %s: %w", name, err)
	}
	return nil
}
