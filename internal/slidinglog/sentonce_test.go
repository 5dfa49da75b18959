package slidinglog

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
)

// answerHook answers every command at once with an empty array, without a
// network, so that a test counts what a call costs the library and
// go-redis.
type answerHook struct{ sent []redis.Cmder }

func (h *answerHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *answerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *answerHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(_ context.Context, cmd redis.Cmder) error {
		if h.sent != nil {
			h.sent = append(h.sent, cmd)
		}
		cmd.(interface{ SetVal(any) }).SetVal([]any{})
		return nil
	}
}

// TestCallSentOnce: every entry that writes is sent as a command whose
// NoRetry is true, Status as one go-redis may send again; and a call costs
// no more allocations than go-redis's own FCall.
func TestCallSentOnce(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	h := &answerHook{sent: []redis.Cmder{}}
	c.AddHook(h)
	m := scriptMode{code: testCode}
	ctx := context.Background()
	keys, args := []string{"k"}, []any{[]byte("req")}
	for _, e := range []*luaEntry{&testCode.decide, &testCode.rollback, &testCode.forget, &testCode.status} {
		h.sent = h.sent[:0]
		if _, err := m.run(ctx, c, e, keys, args); err != nil {
			t.Fatal(err)
		}
		if len(h.sent) != 1 || h.sent[0].NoRetry() != (e != &testCode.status) || h.sent[0].Name() != "fcall" {
			t.Errorf("%s: sent %v (NoRetry %v)", e.function, h.sent, len(h.sent) == 1 && h.sent[0].NoRetry())
		}
	}
	h.sent = nil
	own := testing.AllocsPerRun(100, func() { _, _ = c.FCall(ctx, testCode.decide.function, keys, args...).Result() })
	ours := testing.AllocsPerRun(100, func() { _, _ = m.run(ctx, c, &testCode.decide, keys, args) })
	t.Logf("allocations per call: go-redis's FCall %v, the library's %v", own, ours)
	if ours > own {
		t.Errorf("a call costs %v allocations, go-redis's FCall %v", ours, own)
	}
}

// TestMayHaveRun: which errors leave unknown whether Redis ran a call.
func TestMayHaveRun(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{redis.ErrClosed, false},
		{redis.ErrPoolTimeout, false},
		{context.DeadlineExceeded, false},
		{context.Canceled, false},
		{&net.OpError{Op: "dial", Err: timeoutError{}}, false},
		{&net.OpError{Op: "read", Err: timeoutError{}}, true},
		{&net.OpError{Op: "write", Err: timeoutError{}}, true},
		{net.ErrClosed, false},
		{io.EOF, true},
		{fmt.Errorf("wrapped: %w", io.ErrUnexpectedEOF), true},
	} {
		if got := MayHaveRun(tc.err); got != tc.want {
			t.Errorf("MayHaveRun(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }
