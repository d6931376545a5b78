package pipenet

import (
	"context"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

func TestHTTPOverPipes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n Network
		for _, addr := range []string{"a:80", "b:80"} {
			ln := n.Listen(addr)
			hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				time.Sleep(time.Second)
				io.WriteString(w, addr)
			})}
			go hs.Serve(ln)
			defer hs.Close()
		}
		tr := &http.Transport{DialContext: n.Dial}
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr}
		start := time.Now()
		for _, addr := range []string{"a:80", "b:80"} {
			resp, err := c.Get("http://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != addr {
				t.Fatalf("%s answered %q", addr, b)
			}
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Fatalf("two 1 s answers took %v of virtual time", d)
		}
		if _, err := c.Get("http://nowhere:80/"); err == nil {
			t.Fatal("dial to an unknown address succeeded")
		}
		ln := Listen("x")
		ln.Close()
		if _, err := ln.Dial(context.Background(), "tcp", "x"); err == nil {
			t.Fatal("dial to a closed listener succeeded")
		}
	})
}
