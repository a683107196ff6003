package eviction

// Elem is the link of an intrusive List. A tracked object embeds one, so
// tracking costs no allocation and no index of its own (the L1 table does
// this; the keyed LRU wraps keys in Elems).
type Elem[T any] struct {
	prev, next *Elem[T]
	list       *List[T]
	Value      T
}

// Next is the next more recent element, or nil.
func (e *Elem[T]) Next() *Elem[T] { return e.next }

// List is the list holding e, or nil when untracked.
func (e *Elem[T]) List() *List[T] { return e.list }

// List is a recency order: Front is the least recent element. The zero
// value is an empty list. Not safe for concurrent use.
type List[T any] struct {
	head, tail *Elem[T]
	n          int
}

// Len is the number of elements.
func (l *List[T]) Len() int { return l.n }

// Front is the least recent element, or nil.
func (l *List[T]) Front() *Elem[T] { return l.head }

// PushBack makes e the most recent element, moving it from whatever list
// held it.
func (l *List[T]) PushBack(e *Elem[T]) {
	if e.list != nil {
		e.list.Remove(e)
	}
	e.prev, e.next, e.list = l.tail, nil, l
	if l.tail != nil {
		l.tail.next = e
	} else {
		l.head = e
	}
	l.tail = e
	l.n++
}

// Remove unlinks e if l holds it.
func (l *List[T]) Remove(e *Elem[T]) {
	if e.list != l {
		return
	}
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next, e.list = nil, nil, nil
	l.n--
}

// Oldest returns up to Target(Len(), ratio) values whose element passes
// eligible, least recent first; ineligible elements are skipped and do not
// count.
func (l *List[T]) Oldest(ratio float64, eligible func(T) bool) []T {
	target := Target(l.n, ratio)
	var out []T
	for e := l.head; e != nil && len(out) < target; e = e.next {
		if eligible == nil || eligible(e.Value) {
			out = append(out, e.Value)
		}
	}
	return out
}
