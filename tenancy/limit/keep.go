package limit

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Keep renews r's leases every interval (every ≤ 0: LeaseTTL/3) from its
// own goroutine until stop is called; stop waits for that goroutine to end
// and may be called more than once. Each renewal's error goes to onErr (may
// be nil); a lost lease (ErrLeaseLost) ends the renewals, a backend error
// does not (the next renewal tries again, and the lease survives up to
// LeaseTTL). When r holds no lease, Keep starts nothing.
func Keep(l Limiter, r *Reservation, every time.Duration, onErr func(error)) (stop func()) {
	if l == nil || !r.Leased() {
		return func() {}
	}
	if every <= 0 {
		every = max(r.ttl/3, time.Millisecond)
	}
	quit := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			err := l.Renew(context.Background(), r)
			if err == nil {
				continue
			}
			if onErr != nil {
				onErr(err)
			}
			if errors.Is(err, ErrLeaseLost) {
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-exited
	}
}
