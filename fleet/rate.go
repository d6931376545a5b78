package fleet

// RatePerReplica is a workload's offered load per replica on the default
// engine profile, in requests per second: about 70% of the highest rate at
// which round robin keeps up (see README "Default rates"). Unknown workloads
// get 1.
func RatePerReplica(workload string) float64 {
	switch workload {
	case "w1":
		return 0.8
	case "w2":
		return 1.75
	case "w3":
		return 0.5
	case "w4":
		return 1
	case "w5":
		return 5
	case "w6":
		return 2.5
	case "w7":
		// The light background stream; the heavy bursts come on top.
		return 0.5
	}
	return 1
}

// DefaultRate is the offered load `inferrail sim` uses for a workload on a
// fleet of n default replicas when no rate is given.
func DefaultRate(workload string, n int) float64 {
	return RatePerReplica(workload) * float64(n)
}

// DefaultRequests is the run length `inferrail sim` uses for a workload when
// neither a request count nor a duration is given: 2000, but for w7, whose
// 600 hold two bursts and their background.
func DefaultRequests(workload string) int {
	if workload == "w7" {
		return 600
	}
	return 2000
}
