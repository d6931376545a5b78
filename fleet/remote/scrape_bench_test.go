package remote

import (
	"bytes"
	"compress/gzip"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkScrape is one scrape of a vLLM V1 page from a server on
// loopback: the request, the page read and its parse, as the scraper does
// every interval for every replica (the server's side is in the figure
// too). "gzip" is an engine that compresses the page, as vLLM's and the
// mock engine's metrics endpoints do when asked (Go's client asks unless
// told otherwise); "identity" one that does not.
func BenchmarkScrape(b *testing.B) {
	page := fixture(b, "vllm_v1.txt")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(page); err != nil {
		b.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		b.Fatal(err)
	}
	for _, enc := range []string{"identity", "gzip"} {
		b.Run(enc, func(b *testing.B) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", textType)
				if enc == "gzip" && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
					w.Header().Set("Content-Encoding", "gzip")
					w.Write(gz.Bytes())
					return
				}
				w.Write(page)
			}))
			defer srv.Close()
			s, err := NewScraper(ScraperConfig{Client: srv.Client()})
			if err != nil {
				b.Fatal(err)
			}
			t := &target[Report]{name: "a", url: srv.URL + "/metrics"}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				l, err := s.fetch(ctx, t)
				if err != nil {
					b.Fatal(err)
				}
				if l.Running < 0 {
					b.Fatal("negative load")
				}
			}
		})
	}
}
