package gateway

import (
	"slices"

	"github.com/inferrail/inferrail/internal/timeheap"
)

// queue holds the tickets of requests no replica can admit yet: priority
// classes served highest first, inside a class deficit round robin over
// tenants (each tenant's quantum is its weight, a request costs 1), FIFO
// inside a tenant. Removal is lazy: a ticket that left the queue (aborted,
// timed out) stays in its tenant's deque until it reaches the head, and is
// skipped there; dead tickets are compacted when they outnumber live ones.
// Push and pop are O(1) amortised but for the class lookup (O(classes)); the
// deadline heap is O(log n).
type queue struct {
	classes []*qclass // sorted by priority, highest first
	live    int
	dead    int
	bytes   int64
	dl      timeheap.Heap[Ticket] // queued tickets by deadline
}

type qclass struct {
	prio     int
	live     int
	ring     []*qflow // tenants with live tickets, in round-robin order
	pos      int
	byTenant map[string]*qflow
}

type qflow struct {
	tenant  string
	weight  int
	deficit int
	live    int
	active  bool
	items   deque
}

// isLive reports whether a queued ticket is still waiting.
type liveFunc func(t Ticket) bool

func (q *queue) class(prio int) *qclass {
	i, found := slices.BinarySearchFunc(q.classes, prio, func(c *qclass, p int) int { return p - c.prio })
	if found {
		return q.classes[i]
	}
	c := &qclass{prio: prio, byTenant: map[string]*qflow{}}
	q.classes = slices.Insert(q.classes, i, c)
	return c
}

// push queues t at the back of its tenant's line, or at the front for a
// request that had already reached the head once (a retry).
func (q *queue) push(t Ticket, prio int, tenant string, weight int, front bool) {
	c := q.class(prio)
	f := c.byTenant[tenant]
	if f == nil {
		f = &qflow{tenant: tenant}
		c.byTenant[tenant] = f
	}
	f.weight = max(1, weight)
	if front {
		f.items.pushFront(t)
	} else {
		f.items.pushBack(t)
	}
	f.live++
	c.live++
	q.live++
	if !f.active {
		f.active = true
		f.deficit = 0
		c.ring = append(c.ring, f)
		if len(c.ring) == 1 {
			c.pos = 0
			f.deficit = f.weight
		}
	}
}

// ahead counts the live tickets a new request of priority prio waits behind.
func (q *queue) ahead(prio int) int {
	n := 0
	for _, c := range q.classes {
		if c.prio < prio {
			break
		}
		n += c.live
	}
	return n
}

// peek returns the ticket to dispatch next, or false when the queue is empty.
func (q *queue) peek(alive liveFunc) (Ticket, *qclass, bool) {
	for _, c := range q.classes {
		if c.live == 0 {
			continue
		}
		for len(c.ring) > 0 {
			f := c.ring[c.pos]
			for f.items.len() > 0 && !alive(f.items.front()) {
				f.items.popFront()
				q.dead--
			}
			if f.items.len() == 0 || f.live == 0 {
				q.dead -= f.items.len()
				f.items.clear()
				c.deactivate()
				continue
			}
			if f.deficit >= 1 {
				return f.items.front(), c, true
			}
			c.pos = (c.pos + 1) % len(c.ring)
			n := c.ring[c.pos]
			n.deficit += n.weight
		}
	}
	return 0, nil, false
}

// deactivate takes the flow at pos out of the ring; the next one gets its
// quantum.
func (c *qclass) deactivate() {
	f := c.ring[c.pos]
	f.active, f.deficit = false, 0
	c.ring = slices.Delete(c.ring, c.pos, c.pos+1)
	if len(c.ring) == 0 {
		c.pos = 0
		return
	}
	c.pos %= len(c.ring)
	n := c.ring[c.pos]
	n.deficit += n.weight
}

// pop removes the ticket peek returned (c is peek's class).
func (q *queue) pop(c *qclass, bytes int64) {
	f := c.ring[c.pos]
	f.items.popFront()
	f.deficit--
	f.live--
	c.live--
	q.live--
	q.bytes -= bytes
	if f.live == 0 {
		q.dead -= f.items.len()
		f.items.clear()
		c.deactivate()
	}
}

// remove accounts for a ticket that left the queue other than by pop; its
// slot is skipped later.
func (q *queue) remove(prio int, tenant string, bytes int64) {
	c := q.class(prio)
	f := c.byTenant[tenant]
	f.live--
	c.live--
	q.live--
	q.dead++
	q.bytes -= bytes
}

// compact drops dead tickets once they outnumber live ones, so a head that
// cannot be admitted for a long time does not pin the memory of everything
// that timed out behind it.
func (q *queue) compact(alive liveFunc) {
	if q.dead <= q.live+64 {
		return
	}
	for _, c := range q.classes {
		for _, f := range c.byTenant {
			f.items.filter(alive)
		}
		c.dropEmpty()
		// Tenants with nothing queued are forgotten.
		for k, f := range c.byTenant {
			if !f.active && f.items.len() == 0 {
				delete(c.byTenant, k)
			}
		}
	}
	q.dead = 0
}

// dropEmpty takes the flows left with no tickets out of the ring, as peek
// would on reaching them (it never does in a class with nothing live, and
// reaches them only one turn at a time behind a head that waits): the flow
// that had the turn passes it, with its quantum, to the next one kept.
func (c *qclass) dropEmpty() {
	n, pos, passed := 0, 0, false
	for i, f := range c.ring {
		if f.items.len() == 0 {
			f.active, f.deficit = false, 0
			passed = passed || i == c.pos
			continue
		}
		if i < c.pos {
			pos++
		}
		c.ring[n] = f
		n++
	}
	clear(c.ring[n:])
	c.ring = c.ring[:n]
	if n == 0 {
		c.pos = 0
		return
	}
	c.pos = pos % n
	if passed {
		c.ring[c.pos].deficit += c.ring[c.pos].weight
	}
}

// deque is a ring buffer of tickets.
type deque struct {
	buf  []Ticket
	head int
	n    int
}

func (d *deque) len() int { return d.n }

func (d *deque) grow() {
	if d.n < len(d.buf) {
		return
	}
	nb := make([]Ticket, max(8, 2*len(d.buf)))
	for i := 0; i < d.n; i++ {
		nb[i] = d.buf[(d.head+i)%len(d.buf)]
	}
	d.buf, d.head = nb, 0
}

func (d *deque) pushBack(t Ticket) {
	d.grow()
	d.buf[(d.head+d.n)%len(d.buf)] = t
	d.n++
}

func (d *deque) pushFront(t Ticket) {
	d.grow()
	d.head = (d.head - 1 + len(d.buf)) % len(d.buf)
	d.buf[d.head] = t
	d.n++
}

func (d *deque) front() Ticket { return d.buf[d.head] }

func (d *deque) popFront() {
	d.head = (d.head + 1) % len(d.buf)
	d.n--
}

func (d *deque) clear() { d.head, d.n = 0, 0 }

func (d *deque) filter(keep liveFunc) {
	j := 0
	for i := 0; i < d.n; i++ {
		t := d.buf[(d.head+i)%len(d.buf)]
		if keep(t) {
			d.buf[(d.head+j)%len(d.buf)] = t
			j++
		}
	}
	d.n = j
}
