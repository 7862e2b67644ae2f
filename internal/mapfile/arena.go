package mapfile

// arenaChunk is the size of the mappings an Arena carves small requests from.
const arenaChunk = 32 << 20

// Arena hands out zeroed byte slices aligned to 64 bytes for data that lives as long as the
// arena, such as a model's weights copied out of its file: on Linux from large anonymous
// mappings that the kernel may back with huge pages (far fewer page faults when they are first
// written than the Go heap's small pages take), elsewhere from the Go heap. Free releases them
// all at once: nothing Alloc returned may be used after it. The zero Arena is ready to use; an
// Arena is not safe for concurrent use.
type Arena struct {
	maps [][]byte // mappings (or heap blocks) to release
	cur  []byte   // the unused part of the current chunk
}

// Alloc returns n zeroed bytes aligned to 64 bytes.
func (a *Arena) Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	size := (n + 63) &^ 63
	if len(a.cur) < size && size > arenaChunk/4 { // a large request gets a mapping of its own
		m, err := arenaMap(size)
		if err != nil {
			return nil, err
		}
		a.maps = append(a.maps, m)
		return m[:n:n], nil
	}
	if len(a.cur) < size {
		m, err := arenaMap(arenaChunk)
		if err != nil {
			return nil, err
		}
		a.maps = append(a.maps, m)
		a.cur = m
	}
	b := a.cur[:n:n]
	a.cur = a.cur[size:]
	return b, nil
}

// Reserve maps n bytes at once for the allocations that follow (n their sizes rounded up to
// 64, added up), so that they share one mapping, with nothing left over but its last page: the
// way to allocate many buffers whose sizes are known beforehand. The unused part of an earlier
// chunk is given up.
func (a *Arena) Reserve(n int) error {
	if n <= 0 {
		return nil
	}
	m, err := arenaMap((n + 63) &^ 63)
	if err != nil {
		return err
	}
	a.maps = append(a.maps, m)
	a.cur = m
	return nil
}

// Free releases everything Alloc returned.
func (a *Arena) Free() error {
	var first error
	for _, m := range a.maps {
		if err := arenaUnmap(m); err != nil && first == nil {
			first = err
		}
	}
	a.maps, a.cur = nil, nil
	return first
}
