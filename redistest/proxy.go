package redistest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidinglog/ratelimit/internal/testlog"
)

// Proxy is a TCP proxy on loopback in front of a server, for tests that
// need a slow network: it can hold back what clients send for a while
// before passing it on. It is closed, with every connection, when the test
// ends.
type Proxy struct {
	// Addr is where clients connect instead of the server.
	Addr string

	target string
	ln     net.Listener
	delay  atomic.Int64 // nanoseconds each client write is held back
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	done   chan struct{} // closed with the proxy: ends the delays under way
	held   chan struct{} // gets a value (if it has room) when a chunk is held back
}

// NewProxy starts a proxy to the server at target (host:port) on a free
// loopback port, with no delay. It fails tb when it cannot listen; a
// client's connection is closed when the proxy cannot reach target.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	testlog.Attach(tb) // go-redis's log goes to tb's (see Main)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, done: make(chan struct{}), held: make(chan struct{}, 1)}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

// SetDelay makes the proxy hold back every chunk a client sends for d
// before it passes it to the server, in order: a request reaches the server
// d after it was sent. Replies are passed on at once. 0 turns it off. A
// chunk held back when the test ends is dropped: closing the proxy does
// not wait out the delay.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			p.forward(server, client, true)
		}()
		go func() {
			defer p.wg.Done()
			p.forward(client, server, false)
		}()
	}
}

// track records a connection pair to close with the proxy, and reports
// false (closing both) if the proxy is closed already.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	p.conns = append(p.conns, conns...)
	return true
}

// forward copies from src to dst, holding each chunk back by the delay if
// delayed, until either side closes; then it closes both.
func (p *Proxy) forward(dst, src net.Conn, delayed bool) {
	defer dst.Close()
	defer src.Close()
	if !delayed {
		_, _ = io.Copy(dst, src)
		return
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(p.delay.Load()); d > 0 {
				t := time.NewTimer(d) // the simulated latency itself
				select {
				case p.held <- struct{}{}:
				default:
				}
				select {
				case <-t.C:
				case <-p.done:
					t.Stop()
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) close() {
	p.mu.Lock()
	if !p.closed {
		close(p.done)
	}
	p.closed = true
	conns := p.conns
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}
