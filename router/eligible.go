package router

import "slices"

// Replica is what the router knows of one replica before filtering.
type Replica struct {
	Candidate
	// Healthy is false while health checks fail or the replica is ejected.
	Healthy bool
	// Models lists the models the replica serves.
	Models []string
	// MaxInFlight caps requests in flight (0 = no cap).
	MaxInFlight int
	// MaxPending caps requests waiting for their first byte (0 = no cap).
	MaxPending int
}

// Eligible appends to out the candidates a policy may choose for model:
// healthy replicas that serve it and have room. Policies only ever see these.
func Eligible(model string, reps []Replica, out []Candidate) []Candidate {
	for i := range reps {
		r := &reps[i]
		if !r.Healthy || !slices.Contains(r.Models, model) {
			continue
		}
		if r.MaxInFlight > 0 && r.Load.InFlight >= r.MaxInFlight {
			continue
		}
		if r.MaxPending > 0 && r.Load.Pending >= r.MaxPending {
			continue
		}
		out = append(out, r.Candidate)
	}
	return out
}
