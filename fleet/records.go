package fleet

import (
	"fmt"

	"github.com/inferrail/inferrail/results"
)

// How a run keeps its records. A request's record is created when the
// request arrives and filled in as it is dispatched, streams its tokens and
// ends; it then waits in the run's record window until every request that
// arrived before it has ended too, and leaves it in arrival order: into the
// run's summary (a results.Accumulator, which holds counts and, past its
// exact limit, sketches rather than records), to Config.Record, and to
// Output.Records when Config.KeepRecords asks for them. The window holds
// the records from the oldest request still in flight to the newest
// arrival, so a run's memory follows what is in flight (at 160 req/s and
// requests that live at most a minute, about 10,000 records, 2 MB), not
// its length.

// recordWindow is the run's records from the oldest one not yet retired on,
// by arrival sequence number (0, 1, 2, ...): a ring that grows to hold
// them.
type recordWindow struct {
	recs  []results.Record // ring; its length is zero or a power of two
	ended []bool           // ended[i]: recs[i]'s request has ended
	head  int              // the sequence number of the oldest record held
	n     int              // records held
}

// push adds the record of the next arrival and returns its sequence
// number. It may move the records: pointers from at do not survive it.
func (w *recordWindow) push(r results.Record) int {
	if w.n == len(w.recs) {
		w.grow()
	}
	seq := w.head + w.n
	i := seq & (len(w.recs) - 1)
	w.recs[i], w.ended[i] = r, false
	w.n++
	return seq
}

// grow doubles the ring, keeping every record at its sequence number.
func (w *recordWindow) grow() {
	size := max(64, 2*len(w.recs))
	recs, ended := make([]results.Record, size), make([]bool, size)
	for seq := w.head; seq < w.head+w.n; seq++ {
		recs[seq&(size-1)] = w.recs[seq&(len(w.recs)-1)]
		ended[seq&(size-1)] = w.ended[seq&(len(w.recs)-1)]
	}
	w.recs, w.ended = recs, ended
}

// at is the record of sequence number seq, which must be held.
func (w *recordWindow) at(seq int) *results.Record {
	return &w.recs[seq&(len(w.recs)-1)]
}

// end marks seq's request ended.
func (w *recordWindow) end(seq int) { w.ended[seq&(len(w.recs)-1)] = true }

// oldest returns the oldest record held if its request has ended.
func (w *recordWindow) oldest() (*results.Record, bool) {
	if w.n == 0 || !w.ended[w.head&(len(w.recs)-1)] {
		return nil, false
	}
	return w.at(w.head), true
}

// drop lets go of the oldest record.
func (w *recordWindow) drop() {
	w.recs[w.head&(len(w.recs)-1)] = results.Record{} // no strings kept alive
	w.head++
	w.n--
}

// retire marks the request of record seq ended and hands on, in arrival
// order, every record whose request and predecessors have all ended: to
// the summary, to Config.Record and, with KeepRecords, to Output.Records.
// The first error of Config.Record stops the run (sim.err).
func (s *sim) retire(seq int) {
	s.records.end(seq)
	for {
		r, ok := s.records.oldest()
		if !ok {
			return
		}
		s.acc.Add(r)
		if s.cfg.KeepRecords {
			s.kept = append(s.kept, *r)
		}
		if s.cfg.Record != nil && s.err == nil {
			if err := s.cfg.Record(r); err != nil {
				s.err = fmt.Errorf("record of request %d: %w", r.ID, err)
			}
		}
		s.records.drop()
	}
}
