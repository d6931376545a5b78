package live

import (
	"context"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inferrail/inferrail/internal/testredis"
	"github.com/inferrail/inferrail/live/config"
	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/tenancy"
)

// benchWriter is the least ResponseWriter: headers only.
type benchWriter struct{ h http.Header }

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *benchWriter) WriteHeader(int)             {}

// BenchmarkTenancyAuthLimits is one request's tenancy in live's path, as
// handleGenerate calls it: authenticate (a cached key: parse, hash,
// compare), authorize, reserve (three buckets: the key's RPM, TPM and
// concurrency, key x model, global; the x-ratelimit headers), the lease
// renewer started and stopped, release (Finish with the usage, one usage
// row merged into the meter's buffer). In process and through a real
// Redis on a unix socket, with and without concurrency limits (a lease and
// its renewer); p50 and p99 reported.
func BenchmarkTenancyAuthLimits(b *testing.B) {
	// local-rates: no concurrency limit anywhere, so no lease and no
	// renewal goroutine.
	for _, mode := range []string{"local", "local-rates", "redis", "redis-rates"} {
		b.Run(mode, func(b *testing.B) {
			c := config.Default()
			m := config.DefaultModel()
			m.Name = "m"
			m.Replicas = []config.Replica{{Name: "a", URL: "http://127.0.0.1:1"}}
			leases := !strings.HasSuffix(mode, "-rates")
			m.KeyLimits = config.Limits{RPM: 1 << 30, TPM: 1 << 39}
			if leases {
				m.KeyLimits.MaxConcurrency = 1 << 19
			}
			c.Models = []config.Model{m}
			c.Auth = config.AuthKeys
			c.Tenancy.Store = filepath.Join(b.TempDir(), "t.db")
			c.Tenancy.Limits.Global = config.Limits{RPM: 1 << 30, TPM: 1 << 39}
			if strings.HasPrefix(mode, "redis") {
				srv := testredis.Start(b)
				c.Tenancy.Redis.Address = "unix://" + srv.Addr
			}
			s, err := New(&c, Deps{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			k, plain, err := tenancy.NewKey("bench", time.Now())
			if err != nil {
				b.Fatal(err)
			}
			k.RPM, k.TPM = tenancy.MaxRPM, tenancy.MaxTPM
			if leases {
				k.MaxConcurrency = tenancy.MaxConcurrencyLimit
			}
			if _, err := s.ten.store.CreateKey(context.Background(), k); err != nil {
				b.Fatal(err)
			}
			r, err := http.NewRequest("POST", "/v1/completions", nil)
			if err != nil {
				b.Fatal(err)
			}
			r.Header.Set("Authorization", "Bearer "+plain)
			w := &benchWriter{h: http.Header{}}
			ctx := context.Background()
			one := func() {
				clear(w.h)
				ar := &accessRecord{began: time.Now()}
				g, ok := s.authenticate(w, r, ar)
				if !ok {
					b.Fatal("refused")
				}
				in := &inbound{m: s.models[0], req: gateway.Request{PromptTokens: 200, MaxTokens: 100}}
				if e := s.authorize(g, in, r.Header); e != nil {
					b.Fatal(e.msg)
				}
				if e := s.reserve(ctx, w, g, in); e != nil {
					b.Fatal(e.msg)
				}
				g.relayed, g.whole, ar.status, ar.outputTokens = true, true, http.StatusOK, 80
				s.release(g, in, ar)
			}
			one() // the key is cached, the scripts loaded
			took := make([]time.Duration, 0, min(b.N, 1<<20))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				one()
				if len(took) < cap(took) {
					took = append(took, time.Since(t0))
				}
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}
