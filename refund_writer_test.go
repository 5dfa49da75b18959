package ratelimit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ioBound bounds the reads and waits of these tests so that a broken
// wrapper fails them instead of hanging; a working one never comes near it,
// even on a loaded machine.
const ioBound = 30 * time.Second

// refundLimiter returns a Limiter that counts requests by their X-Case
// header under the limit "case" and refunds 5xx responses, and the channel
// that receives every status its refund func is asked about.
func refundLimiter(t *testing.T, c redis.UniversalClient) (*Limiter, <-chan int) {
	statuses := make(chan int, 100)
	lim := mustNew(t, c, []Limit{Per(time.Minute, 1000, Header("X-Case")).Named("case")},
		WithRefund(func(status int) bool {
			statuses <- status
			return status >= 500
		}))
	return lim, statuses
}

// limitedServer serves lim's middleware around h on a real HTTP/1 server,
// and returns it with a channel that receives once the middleware has
// returned (and refunded) for each request. errorLog, if not nil, replaces
// the server's log.
func limitedServer(t *testing.T, lim *Limiter, h http.Handler, errorLog *log.Logger) (*httptest.Server, <-chan struct{}) {
	mw := lim.Handler(h)
	done := make(chan struct{}, 100)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mw.ServeHTTP(w, r)
		done <- struct{}{}
	}))
	srv.Config.ErrorLog = errorLog
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, done
}

// waitServed waits until the middleware has returned for a request, and
// returns the status its refund func saw.
func waitServed(t *testing.T, done <-chan struct{}, statuses <-chan int) int {
	t.Helper()
	select {
	case <-done:
	case <-time.After(ioBound):
		t.Fatal("the middleware did not return")
	}
	select {
	case s := <-statuses:
		return s
	default:
		t.Fatal("the refund func was not asked")
		return 0
	}
}

// getCase sends GET / with X-Case: name to srv and returns the response.
func getCase(t *testing.T, srv *httptest.Server, name string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Case", name)
	client := &http.Client{Timeout: ioBound}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// TestRefundWriterSSE: behind WithRefund, a server-sent events handler that
// type-asserts http.Flusher gets one, and the event it flushes reaches a
// real client while the handler is still running. The stream is served
// (200): not refunded.
func TestRefundWriterSSE(t *testing.T) { forBackends(t, testRefundWriterSSE) }

func testRefundWriterSSE(t *testing.T, b backend) {
	c := b.newClient(t)
	lim, statuses := refundLimiter(t, c)
	release := make(chan struct{})
	var once sync.Once
	releaseHandler := func() { once.Do(func() { close(release) }) }
	defer releaseHandler()
	srv, done := limitedServer(t, lim, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "the ResponseWriter is not an http.Flusher", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: hello\n\n")
		f.Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}), nil)

	resp := getCase(t, srv, "sse")
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	// The handler waits for release: the event can only have come from the
	// flush.
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: hello\n" {
		t.Fatalf("read %q, %v before the handler returned; want the flushed event", line, err)
	}
	select {
	case <-done:
		t.Fatal("the middleware returned before the handler was released")
	default:
	}
	releaseHandler()
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	if s := waitServed(t, done, statuses); s != http.StatusOK {
		t.Errorf("refund saw status %d, want 200", s)
	}
	if n := logEntries(t, c, "case", "header.X-Case", "sse"); n != 1 {
		t.Errorf("%d entries after a served stream, want 1 (not refunded)", n)
	}
}

// TestRefundWriterHijack: behind WithRefund, a handler that hijacks the
// connection, as a WebSocket upgrade does, gets an http.Hijacker, answers
// 101 and echoes a line to a raw TCP client. The refund func sees 101: the
// request was served and is not refunded.
func TestRefundWriterHijack(t *testing.T) { forBackends(t, testRefundWriterHijack) }

func testRefundWriterHijack(t *testing.T, b backend) {
	c := b.newClient(t)
	lim, statuses := refundLimiter(t, c)
	srv, done := limitedServer(t, lim, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hj, ok := w.(http.Hijacker)
		if !ok {
			http.Error(w, "the ResponseWriter is not an http.Hijacker", http.StatusInternalServerError)
			return
		}
		conn, buf, err := hj.Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(ioBound))
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		if err := buf.Flush(); err != nil {
			t.Errorf("writing the 101: %v", err)
			return
		}
		line, err := buf.ReadString('\n')
		if err != nil {
			t.Errorf("reading the hijacked connection: %v", err)
			return
		}
		_, _ = buf.WriteString(line)
		if err := buf.Flush(); err != nil {
			t.Errorf("echoing: %v", err)
		}
	}), nil)

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(ioBound)); err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\nX-Case: hijack\r\n\r\n",
		srv.Listener.Addr())
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if _, err := io.WriteString(conn, "ping\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("echo %q, %v; want \"ping\\n\"", line, err)
	}
	if s := waitServed(t, done, statuses); s != http.StatusSwitchingProtocols {
		t.Errorf("refund saw status %d for a hijacked connection, want 101", s)
	}
	if n := logEntries(t, c, "case", "header.X-Case", "hijack"); n != 1 {
		t.Errorf("%d entries after a hijacked request, want 1 (not refunded)", n)
	}
}

// TestRefundWriterResponseController: behind WithRefund,
// http.ResponseController flushes, and a flush that sends the headers
// before anything is written counts as the response's 200: an event stream
// that opens (the client has its 200 while the handler runs) and then fails
// with http.Error, whose 500 the client never sees, is not refunded.
func TestRefundWriterResponseController(t *testing.T) {
	forBackends(t, testRefundWriterResponseController)
}

func testRefundWriterResponseController(t *testing.T, b backend) {
	c := b.newClient(t)
	lim, statuses := refundLimiter(t, c)
	release := make(chan struct{})
	var once sync.Once
	releaseHandler := func() { once.Do(func() { close(release) }) }
	defer releaseHandler()
	// The server logs the superfluous WriteHeader of the late http.Error.
	quiet := log.New(io.Discard, "", 0)
	srv, done := limitedServer(t, lim, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("ResponseController.Flush: %v", err)
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		http.Error(w, "the stream failed", http.StatusInternalServerError)
	}), quiet)

	// The handler waits for release: the response can only have come from
	// the flush.
	resp := getCase(t, srv, "controller")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	select {
	case <-done:
		t.Fatal("the middleware returned before the handler was released")
	default:
	}
	releaseHandler()
	if body, err := io.ReadAll(resp.Body); err != nil || string(body) != "the stream failed\n" {
		t.Errorf("body %q, %v", body, err)
	}
	if s := waitServed(t, done, statuses); s != http.StatusOK {
		t.Errorf("refund saw status %d for a stream flushed with 200, want 200", s)
	}
	if n := logEntries(t, c, "case", "header.X-Case", "controller"); n != 1 {
		t.Errorf("%d entries after a served stream, want 1 (not refunded)", n)
	}
}

// fakeWriter is a ResponseWriter with every optional interface the refund
// wrapper keeps; it records the calls that reach it.
type fakeWriter struct {
	h     http.Header
	calls []string
}

func (w *fakeWriter) Header() http.Header { return w.h }
func (w *fakeWriter) Write(b []byte) (int, error) {
	w.calls = append(w.calls, "Write")
	return len(b), nil
}
func (w *fakeWriter) WriteHeader(int) { w.calls = append(w.calls, "WriteHeader") }
func (w *fakeWriter) Flush()          { w.calls = append(w.calls, "Flush") }
func (w *fakeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.calls = append(w.calls, "Hijack")
	return nil, nil, nil
}
func (w *fakeWriter) ReadFrom(src io.Reader) (int64, error) {
	w.calls = append(w.calls, "ReadFrom")
	return io.Copy(io.Discard, src)
}
func (w *fakeWriter) Push(string, *http.PushOptions) error {
	w.calls = append(w.calls, "Push")
	return nil
}

// TestRefundWriterInterfaces: behind WithRefund, a handler finds
// http.Flusher, http.Hijacker, io.ReaderFrom and http.Pusher on its
// ResponseWriter exactly when the server's writer has them, for each of
// the 16 combinations (the empty one is a minimal custom writer, which
// gains nothing), and each call reaches the server's writer.
// ResponseController.Flush works when the writer can flush, and reports
// http.ErrNotSupported when it cannot.
func TestRefundWriterInterfaces(t *testing.T) { forBackends(t, testRefundWriterInterfaces) }

func testRefundWriterInterfaces(t *testing.T, b backend) {
	type (
		W = http.ResponseWriter
		F = http.Flusher
		H = http.Hijacker
		R = io.ReaderFrom
		P = http.Pusher
	)
	// Each writer has the interfaces its name spells, from the fake.
	writers := map[string]func(f *fakeWriter) http.ResponseWriter{
		"": func(f *fakeWriter) W { return struct{ W }{f} },
		"F": func(f *fakeWriter) W {
			return struct {
				W
				F
			}{f, f}
		},
		"H": func(f *fakeWriter) W {
			return struct {
				W
				H
			}{f, f}
		},
		"FH": func(f *fakeWriter) W {
			return struct {
				W
				F
				H
			}{f, f, f}
		},
		"R": func(f *fakeWriter) W {
			return struct {
				W
				R
			}{f, f}
		},
		"FR": func(f *fakeWriter) W {
			return struct {
				W
				F
				R
			}{f, f, f}
		},
		"HR": func(f *fakeWriter) W {
			return struct {
				W
				H
				R
			}{f, f, f}
		},
		"FHR": func(f *fakeWriter) W {
			return struct {
				W
				F
				H
				R
			}{f, f, f, f}
		},
		"P": func(f *fakeWriter) W {
			return struct {
				W
				P
			}{f, f}
		},
		"FP": func(f *fakeWriter) W {
			return struct {
				W
				F
				P
			}{f, f, f}
		},
		"HP": func(f *fakeWriter) W {
			return struct {
				W
				H
				P
			}{f, f, f}
		},
		"FHP": func(f *fakeWriter) W {
			return struct {
				W
				F
				H
				P
			}{f, f, f, f}
		},
		"RP": func(f *fakeWriter) W {
			return struct {
				W
				R
				P
			}{f, f, f}
		},
		"FRP": func(f *fakeWriter) W {
			return struct {
				W
				F
				R
				P
			}{f, f, f, f}
		},
		"HRP": func(f *fakeWriter) W {
			return struct {
				W
				H
				R
				P
			}{f, f, f, f}
		},
		"FHRP": func(f *fakeWriter) W {
			return struct {
				W
				F
				H
				R
				P
			}{f, f, f, f, f}
		},
	}
	c := b.newClient(t)
	lim, statuses := refundLimiter(t, c)
	var got string // the interfaces the handler found
	var flushErr error
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = ""
		flushErr = http.NewResponseController(w).Flush()
		if f, ok := w.(http.Flusher); ok {
			got += "F"
			f.Flush()
		}
		if p, ok := w.(http.Pusher); ok {
			_ = p.Push("/style.css", nil)
		}
		if rf, ok := w.(io.ReaderFrom); ok {
			_, _ = rf.ReadFrom(strings.NewReader("body"))
		}
		if hj, ok := w.(http.Hijacker); ok {
			got += "H"
			_, _, _ = hj.Hijack()
		}
		if _, ok := w.(io.ReaderFrom); ok {
			got += "R"
		}
		if _, ok := w.(http.Pusher); ok {
			got += "P"
		}
	}))
	for name, newWriter := range writers {
		f := &fakeWriter{h: http.Header{}}
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Case", "interfaces-"+name)
		h.ServeHTTP(newWriter(f), r)
		select {
		case <-statuses:
		default:
			t.Fatalf("writer with %q: the refund func was not asked", name)
		}
		if got != name {
			t.Errorf("writer with %q: the handler found %q", name, got)
		}
		for letter, method := range map[string]string{"F": "Flush", "H": "Hijack", "R": "ReadFrom", "P": "Push"} {
			if reached := slices.Contains(f.calls, method); reached != strings.Contains(name, letter) {
				t.Errorf("writer with %q: %s reached it: %v (calls %v)", name, method, reached, f.calls)
			}
		}
		if canFlush := strings.Contains(name, "F"); canFlush != (flushErr == nil) ||
			!canFlush && !errors.Is(flushErr, http.ErrNotSupported) {
			t.Errorf("writer with %q: ResponseController.Flush: %v", name, flushErr)
		}
	}
}

// TestRefundWriterStatus: with the wrapper that keeps the interfaces, the
// middleware still refunds a 5xx, including one after a 103 Early Hints;
// and a response that has flushed or sent a body with ReadFrom has its 200,
// so a later http.Error does not make it refunded.
func TestRefundWriterStatus(t *testing.T) { forBackends(t, testRefundWriterStatus) }

func testRefundWriterStatus(t *testing.T, b backend) {
	cases := []struct {
		name     string
		serve    func(w http.ResponseWriter) error
		status   int // what refund sees
		refunded bool
	}{
		{"ok", func(http.ResponseWriter) error { return nil }, 200, false},
		{"bad-gateway", func(w http.ResponseWriter) error {
			w.WriteHeader(http.StatusBadGateway)
			return nil
		}, 502, true},
		{"early-hints", func(w http.ResponseWriter) error {
			w.Header().Set("Link", "</style.css>; rel=preload; as=style")
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusBadGateway)
			return nil
		}, 502, true},
		{"flush-then-error", func(w http.ResponseWriter) error {
			f, ok := w.(http.Flusher)
			if !ok {
				return errors.New("the ResponseWriter is not an http.Flusher")
			}
			f.Flush()
			http.Error(w, "failed", http.StatusInternalServerError)
			return nil
		}, 200, false},
		{"readfrom-then-error", func(w http.ResponseWriter) error {
			rf, ok := w.(io.ReaderFrom)
			if !ok {
				return errors.New("the ResponseWriter is not an io.ReaderFrom")
			}
			if _, err := rf.ReadFrom(strings.NewReader("body")); err != nil {
				return err
			}
			http.Error(w, "failed", http.StatusInternalServerError)
			return nil
		}, 200, false},
	}
	c := b.newClient(t)
	lim, statuses := refundLimiter(t, c)
	// The server logs the superfluous WriteHeader of a late http.Error.
	quiet := log.New(io.Discard, "", 0)
	srv, done := limitedServer(t, lim, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, tc := range cases {
			if tc.name == r.Header.Get("X-Case") {
				if err := tc.serve(w); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
				return
			}
		}
		http.NotFound(w, r)
	}), quiet)
	for _, tc := range cases {
		resp := getCase(t, srv, tc.name)
		body, _ := io.ReadAll(resp.Body)
		if s := waitServed(t, done, statuses); s != tc.status {
			t.Errorf("%s: refund saw %d, want %d (response %d %q)", tc.name, s, tc.status, resp.StatusCode, body)
		}
		want := int64(1)
		if tc.refunded {
			want = 0
		}
		if n := logEntries(t, c, "case", "header.X-Case", tc.name); n != want {
			t.Errorf("%s: %d entries, want %d", tc.name, n, want)
		}
	}
}
