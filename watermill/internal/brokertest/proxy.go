package brokertest

import (
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy to a broker that the test takes down (every
// connection dropped, new ones refused: nothing listens on its port) and
// brings back on the same address: the module root's faultProxy
// (fault_outage_test.go), for brokers.
type Proxy struct {
	Addr, target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// StartProxy proxies to target (host:port) until cleanup.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln := listenOutsideEphemeral(t)
	p := &Proxy{Addr: ln.Addr().String(), target: target, conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(func() {
		p.takeDown()
		p.wg.Wait()
	})
	return p
}

// listenOutsideEphemeral listens on a loopback port below Linux's
// ephemeral range, so that while the proxy is down no client can be given
// its port as a source port (a TCP self-connect).
func listenOutsideEphemeral(t testing.TB) net.Listener {
	t.Helper()
	var err error
	for range 100 {
		var ln net.Listener
		ln, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+mrand.IntN(12000)))
		if err == nil {
			return ln
		}
	}
	t.Fatalf("brokertest: no free loopback port between 20000 and 32000: %v", err)
	return nil
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go p.pipe(c)
		}
	}()
}

func (p *Proxy) pipe(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	if !p.track(client, server) {
		_ = client.Close()
		_ = server.Close()
		return
	}
	defer p.untrack(client, server)
	done := make(chan struct{}, 2)
	copyHalf := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go copyHalf(server, client)
	go copyHalf(client, server)
	<-done
	<-done
}

func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		delete(p.conns, c)
	}
}

func (p *Proxy) takeDown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
}

// Down cuts every connection and refuses new ones.
func (p *Proxy) Down(t testing.TB) {
	t.Helper()
	p.takeDown()
	if c, err := net.DialTimeout("tcp", p.Addr, time.Second); err == nil {
		_ = c.Close()
		t.Fatalf("brokertest: the proxy's address %s still accepts connections during the outage", p.Addr)
	}
}

// Up listens on the same address again.
func (p *Proxy) Up(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ln, err := net.Listen("tcp", p.Addr)
		if err == nil {
			p.serve(ln)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("brokertest: cannot listen on %s again: %v", p.Addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
