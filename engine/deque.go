package engine

// deque is a ring-buffer double-ended queue of sequences: FIFO waiting with
// preempted requests returned to the front.
type deque struct {
	buf        []*seq
	head, size int
}

func (d *deque) len() int { return d.size }

func (d *deque) grow() {
	n := max(16, 2*len(d.buf))
	nb := make([]*seq, n)
	for i := 0; i < d.size; i++ {
		nb[i] = d.buf[(d.head+i)%len(d.buf)]
	}
	d.buf, d.head = nb, 0
}

func (d *deque) pushBack(s *seq) {
	if d.size == len(d.buf) {
		d.grow()
	}
	d.buf[(d.head+d.size)%len(d.buf)] = s
	d.size++
}

func (d *deque) pushFront(s *seq) {
	if d.size == len(d.buf) {
		d.grow()
	}
	d.head = (d.head - 1 + len(d.buf)) % len(d.buf)
	d.buf[d.head] = s
	d.size++
}

func (d *deque) popFront() *seq {
	s := d.buf[d.head]
	d.buf[d.head] = nil
	d.head = (d.head + 1) % len(d.buf)
	d.size--
	return s
}

func (d *deque) at(i int) *seq { return d.buf[(d.head+i)%len(d.buf)] }

// remove deletes s, keeping the order of the rest.
func (d *deque) remove(s *seq) {
	for i := 0; i < d.size; i++ {
		if d.at(i) == s {
			for j := i; j < d.size-1; j++ {
				d.buf[(d.head+j)%len(d.buf)] = d.at(j + 1)
			}
			d.buf[(d.head+d.size-1)%len(d.buf)] = nil
			d.size--
			return
		}
	}
}

// removeAt deletes the i-th element, keeping the order of the rest.
func (d *deque) removeAt(i int) {
	if i == 0 {
		d.popFront()
		return
	}
	for j := i; j < d.size-1; j++ {
		d.buf[(d.head+j)%len(d.buf)] = d.at(j + 1)
	}
	d.buf[(d.head+d.size-1)%len(d.buf)] = nil
	d.size--
}
