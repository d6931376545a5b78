package router

import "time"

// Candidates appends to dst the candidates RouteAdmitted would offer its
// policy for req among reps at now, before admission, with the index's
// predictions, and returns it. It records nothing. In events mode it first
// expires the speculation due by now, as RouteAdmitted does at the same
// time: housekeeping any later decision would do first, so no decision
// differs for it.
func (r *Router) Candidates(now time.Duration, req *Request, reps []Replica, dst []Candidate) []Candidate {
	if !r.predict(now, req, reps) {
		return dst
	}
	return append(dst, r.cands...)
}

// Offered returns the candidates the last successful RouteAdmitted offered
// its policy (the admitted ones, with their predictions), valid until the
// next call into r. Shadow mode asks a second policy about the same set.
func (r *Router) Offered() []Candidate { return r.cands }

// Estimator returns cost_model's estimator for the router's engines.
func (r *Router) Estimator() Estimator { return NewEstimator(r.cfg.Options) }

// Options returns the router's policy options (defaults filled in).
func (r *Router) Options() Options { return r.cfg.Options }
