package limit

import (
	"testing"
	"time"

	"github.com/inferrail/inferrail/internal/testredis"
)

// benchRequest is a proxy's typical request: key, key×model and global
// buckets, limits high enough that every request is admitted (the cost
// measured is the check and the charge, not a refusal).
func benchRequest(leases bool) Request {
	c := 0
	if leases {
		c = 1 << 20
	}
	return Request{Buckets: []Bucket{
		{ID: "key:k_0123456789", Limits: Limits{RPM: 1 << 30, TPM: 1 << 38, MaxConcurrency: c}},
		{ID: "key:k_0123456789:model:llama-3.1-8b", Limits: Limits{RPM: 1 << 30, TPM: 1 << 38}},
		{ID: "global", Limits: Limits{RPM: 1 << 30, TPM: 1 << 38, MaxConcurrency: c}},
	}, Tokens: 1200}
}

func benchLocal(b *testing.B, leases bool) {
	l, err := NewLocal(Config{})
	if err != nil {
		b.Fatal(err)
	}
	req := benchRequest(leases)
	b.ReportAllocs()
	for b.Loop() {
		d, err := l.Reserve(bg, req)
		if err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
		if err := l.Finish(bg, d.Reservation, 900); err != nil {
			b.Fatal(err)
		}
	}
}

// Reserve + Finish over three buckets, in process.
func BenchmarkLocalReserveFinish(b *testing.B)       { benchLocal(b, false) }
func BenchmarkLocalReserveFinishLeased(b *testing.B) { benchLocal(b, true) }

// The same from every core at once: one mutex.
func BenchmarkLocalParallel(b *testing.B) {
	l, _ := NewLocal(Config{})
	req := benchRequest(true)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d, _ := l.Reserve(bg, req)
			_ = l.Finish(bg, d.Reservation, 900)
		}
	})
}

// Reserve + Finish through a real redis-server on a unix socket: one
// EVALSHA for Reserve and one for Finish (a TPM refund; leases or not), so
// two round trips per request. Reports p50 and p99 of the pair.
func benchRedis(b *testing.B, leases bool) {
	srv := testredis.Start(b)
	r := newRedisLimiter(b, newClient(b, srv.Network, srv.Addr), RedisConfig{Timeout: time.Second})
	req := benchRequest(leases)
	var lat []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		d, err := r.Reserve(bg, req)
		if err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
		if err := r.Finish(bg, d.Reservation, 900); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.ReportMetric(float64(percentile(lat, 0.5).Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(percentile(lat, 0.99).Nanoseconds())/1e3, "p99-µs")
}

func BenchmarkRedisReserveFinish(b *testing.B)       { benchRedis(b, false) }
func BenchmarkRedisReserveFinishLeased(b *testing.B) { benchRedis(b, true) }

// Reserve alone through Redis (a Finish with exact usage and no lease makes
// no call): the one round trip of the common case.
func BenchmarkRedisReserve(b *testing.B) {
	srv := testredis.Start(b)
	r := newRedisLimiter(b, newClient(b, srv.Network, srv.Addr), RedisConfig{Timeout: time.Second})
	req := benchRequest(false)
	var lat []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		d, err := r.Reserve(bg, req)
		if err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
		_ = r.Finish(bg, d.Reservation, req.Tokens)
		lat = append(lat, time.Since(start))
	}
	b.ReportMetric(float64(percentile(lat, 0.5).Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(percentile(lat, 0.99).Nanoseconds())/1e3, "p99-µs")
}
