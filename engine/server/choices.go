package server

// Parallel sampling (n > 1), as vLLM V1 serves it: the request fans out into
// n child requests with the same prompt, each its own sequence in the engine
// (so the engine runs and counts n; their prompt blocks hash alike, though
// the engine model registers a block in the prefix cache only once a step
// has computed it, so children prefilled in the same step do not share it
// as vLLM V1's, which caches at allocation, do), and their outputs are
// merged into the choices of one answer, by index. The stream and the full
// body are handlers.go's stream and writeFull, which take the children in
// order.

// checkN validates n (nil: 1). vLLM refuses n < 1 with this message; the mock
// engine also refuses more choices than it runs sequences at once.
func (s *Server) checkN(n *int) (int, error) {
	if n == nil {
		return 1, nil
	}
	if *n < 1 {
		return 0, badRequest("n", "n must be at least 1, got %d.", *n)
	}
	if limit := s.cfg.Engine.MaxNumSeqs; *n > limit {
		return 0, badRequest("n", "n must be at most %d (the engine's max_num_seqs: it runs that many sequences at once), got %d.", limit, *n)
	}
	return *n, nil
}

// checkKVWithN refuses kv_transfer_params with n > 1: the mock's P/D
// connector hands over the KV of one sequence.
func checkKVWithN(g *generation) error {
	if g.n > 1 && g.kv != nil {
		return badRequest("kv_transfer_params", "kv_transfer_params with n = %d: a disaggregated prefill or decode takes one sequence (n = 1).", g.n)
	}
	return nil
}

// newChoices returns the g.n children of a request, a (choice 0) first;
// all signal a's notify channel, so that one handler follows them all.
func (s *Server) newChoices(g *generation, a *active) []*active {
	kids := make([]*active, g.n)
	kids[0] = a
	for i := 1; i < g.n; i++ {
		kids[i] = s.newChoice(g, i, a.notify)
	}
	return kids
}

// abortChoices aborts every child still in the engine (the loop ignores
// the others).
func (s *Server) abortChoices(kids []*active) {
	for _, a := range kids {
		if !s.send(command{kind: cmdAbort, id: a.id}) {
			return
		}
	}
}

// allFinished reports whether every child has finished; a failed child's
// error ends the wait.
func allFinished(kids []*active) (bool, error) {
	all := true
	for _, a := range kids {
		_, _, finished, err := a.progress()
		if err != nil {
			return false, err
		}
		all = all && finished
	}
	return all, nil
}
