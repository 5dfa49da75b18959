package ratelimit

import (
	"context"
	"errors"
	"time"
)

func (fakeLibrary) Renew(context.Context, []string, time.Duration, [][]uint64) (int64, error) {
	return 0, errors.New("fakeLibrary: no Renew")
}
