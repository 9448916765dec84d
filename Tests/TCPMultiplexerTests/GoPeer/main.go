// yamux-peer: an independent hashicorp/yamux peer for the TCPMultiplexer interop tests and benchmark.
//
//	yamux-peer serve [-open N -size BYTES]   listen on 127.0.0.1:0, print "LISTENING <port>", take one
//	                                         connection as yamux server, echo every stream it accepts
//	                                         (then half-close); with -open also open N streams itself and
//	                                         check their echo, printing "OPENED-OK".
//	yamux-peer dial -port P -streams N -size BYTES
//	                                         connect as yamux client, open N concurrent streams, send
//	                                         BYTES on each, half-close, check the echo; "DIAL-OK" on success.
//	yamux-peer bench -size BYTES             Go client to Go server over loopback, one stream; prints
//	                                         "BENCH <MB/s>".
package main

import (
	"bytes"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

func config() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = os.Stderr
	return c
}

// echo copies a stream back to itself and half-closes when the peer has.
func echo(s *yamux.Stream) {
	defer s.Close()
	io.Copy(s, s)
}

// exchange sends size pseudo-random bytes, reads the echo and compares digests, then half-closes and
// expects the end of the stream. (This yamux version's Read returns EOF as soon as its buffer is empty
// once the stream is locally closed, so the FIN goes out only after the whole echo is in.)
func exchange(s *yamux.Stream, size int, seed int64) error {
	data := make([]byte, size)
	rand.New(rand.NewSource(seed)).Read(data)
	want := sha256.Sum256(data)
	errc := make(chan error, 1)
	go func() {
		_, err := s.Write(data)
		errc <- err
	}()
	h := sha256.New()
	n, err := io.CopyN(h, s, int64(size))
	if err != nil {
		return fmt.Errorf("stream %d: read after %d bytes: %v", s.StreamID(), n, err)
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("stream %d: write: %v", s.StreamID(), err)
	}
	if !bytes.Equal(h.Sum(nil), want[:]) {
		return fmt.Errorf("stream %d: echo mismatch", s.StreamID())
	}
	if err := s.Close(); err != nil {
		return fmt.Errorf("stream %d: close: %v", s.StreamID(), err)
	}
	if extra, _ := io.Copy(io.Discard, s); extra != 0 {
		return fmt.Errorf("stream %d: %d bytes after the echo", s.StreamID(), extra)
	}
	return nil
}

// openMany opens n streams on sess at once and checks the echo of size bytes on each.
func openMany(sess *yamux.Session, n, size int) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s, err := sess.OpenStream()
			if err != nil {
				errs <- err
				return
			}
			errs <- exchange(s, size, int64(i+1))
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func serve(open, size int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("LISTENING %d\n", ln.Addr().(*net.TCPAddr).Port)
	conn, err := ln.Accept()
	if err != nil {
		return err
	}
	ln.Close()
	sess, err := yamux.Server(conn, config())
	if err != nil {
		return err
	}
	if open > 0 {
		go func() {
			if err := openMany(sess, open, size); err != nil {
				fmt.Printf("OPENED-FAIL %v\n", err)
			} else {
				fmt.Printf("OPENED-OK %d\n", open)
			}
		}()
	}
	for {
		s, err := sess.AcceptStream()
		if err != nil {
			fmt.Printf("SESSION-END %v\n", err)
			return nil
		}
		go echo(s)
	}
}

func dial(port, streams, size int) error {
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return err
	}
	sess, err := yamux.Client(conn, config())
	if err != nil {
		return err
	}
	defer sess.Close()
	if err := openMany(sess, streams, size); err != nil {
		return err
	}
	fmt.Printf("DIAL-OK %d\n", streams)
	return nil
}

func bench(size int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		sess, _ := yamux.Server(conn, config())
		s, err := sess.AcceptStream()
		if err != nil {
			return
		}
		io.Copy(io.Discard, s)
		s.Close()
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	sess, err := yamux.Client(conn, config())
	if err != nil {
		return err
	}
	defer sess.Close()
	s, err := sess.OpenStream()
	if err != nil {
		return err
	}
	chunk := make([]byte, 256*1024)
	start := time.Now()
	for sent := 0; sent < size; sent += len(chunk) {
		if _, err := s.Write(chunk); err != nil {
			return err
		}
	}
	s.Close()
	io.Copy(io.Discard, s) // wait for the server's FIN: everything was read
	secs := time.Since(start).Seconds()
	fmt.Printf("BENCH %.1f\n", float64(size)/1e6/secs)
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: yamux-peer serve|dial|bench [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	port := fs.Int("port", 0, "port to dial")
	streams := fs.Int("streams", 1, "streams to open")
	open := fs.Int("open", 0, "streams the server opens itself")
	size := fs.Int("size", 1<<20, "bytes per stream")
	fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(*open, *size)
	case "dial":
		err = dial(*port, *streams, *size)
	case "bench":
		err = bench(*size)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Printf("FAIL %v\n", err)
		os.Exit(1)
	}
}
