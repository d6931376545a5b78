package workload

import "testing"

// FuzzParseConfig: any workload file is either a valid configuration from
// which a source can be built, or an error; never a panic.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("workload: w1\nrequests: 10\n"))
	f.Add([]byte("workload: w2\nw2:\n  turns_min: 0\n"))
	f.Add([]byte("workload: w5\narrival: {process: gamma, cv: 3}\n"))
	f.Add([]byte("bogus: 1\n"))
	f.Add([]byte("workload: w7\nrequests: 50\nw7: {burst_requests: 20, burst_window: 0s}\n"))
	f.Add([]byte("workload: w2\nrequests: 30\nmix:\n  - {tenant: a, priority: 1, share: 2}\n  - {tenant: b, share: 1}\n"))
	f.Add([]byte("workload: w6\nrequests: 30\nmix: [{tenant: a, share: 2}, {tenant: n, share: 9}]\ntenants:\n  n: {rpm: 5, tpm: 90000}\nwithout_tenants: [a]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		if c.Requests == 0 && c.Duration == 0 {
			t.Fatal("a config without a limit was accepted")
		}
		if c.MaxModelLen > 1<<20 || c.Requests > 1<<20 {
			return // valid but too big to generate in a fuzz run
		}
		if _, err := New(c); err != nil {
			t.Fatalf("validated config refused by New: %v", err)
		}
	})
}
