package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"unsafe"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Parse parses a GGUF file held in memory. The returned File keeps data (tensor data is not
// copied) and Close on it releases nothing.
func Parse(data []byte) (*File, error) {
	return parse(data)
}

// decoder reads little-endian fields from b. Its read methods report failure with ok == false
// and leave error messages to the caller, so that no message is built on the success path.
type decoder struct {
	b   []byte
	off int
}

func (d *decoder) left() int { return len(d.b) - d.off }

func (d *decoder) errAt(off int, format string, args ...any) *FormatError {
	return &FormatError{Offset: int64(off), Msg: fmt.Sprintf(format, args...)}
}

// truncated reports that need bytes were wanted at the current offset for what.
func (d *decoder) truncated(need int, what string) *FormatError {
	return d.errAt(d.off, "truncated at offset %d reading %s: need %d bytes, %d left",
		d.off, what, need, d.left())
}

func (d *decoder) u32() (uint32, bool) {
	if d.left() < 4 {
		return 0, false
	}
	v := binary.LittleEndian.Uint32(d.b[d.off:])
	d.off += 4
	return v, true
}

func (d *decoder) u64() (uint64, bool) {
	if d.left() < 8 {
		return 0, false
	}
	v := binary.LittleEndian.Uint64(d.b[d.off:])
	d.off += 8
	return v, true
}

// str reads a length-prefixed string in place; what names the field in errors.
func (d *decoder) str(what string) ([]byte, *FormatError) {
	start := d.off
	n, ok := d.u64()
	if !ok {
		return nil, d.truncated(8, what+" length")
	}
	if n > uint64(d.left()) {
		return nil, d.errAt(start, "%s at offset %d: length %d exceeds the %d bytes left",
			what, start, n, d.left())
	}
	s := d.b[d.off : d.off+int(n)]
	d.off += int(n)
	return s, nil
}

// prefix adds context in front of an error's message.
func prefix(e *FormatError, format string, args ...any) *FormatError {
	e.Msg = fmt.Sprintf(format, args...) + e.Msg
	return e
}

const (
	minKVSize     = 8 + 1 + 4 + 1 // key length, a 1-byte key, value type, a 1-byte value
	minTensorInfo = 8 + 4 + 4 + 8 // name length, n_dims, dtype, offset
)

func parse(b []byte) (*File, error) {
	f, e := parseFile(b)
	if e != nil {
		return nil, e // keep a nil *FormatError from becoming a non-nil error
	}
	return f, nil
}

func parseFile(b []byte) (*File, *FormatError) {
	d := &decoder{b: b}
	if len(b) < 4 {
		return nil, d.truncated(4, "magic")
	}
	switch string(b[:4]) {
	case "GGUF":
	case "FUGG":
		return nil, d.errAt(0, "magic %q is byte-swapped: big-endian GGUF files are not supported", b[:4])
	default:
		return nil, d.errAt(0, "bad magic %q, want \"GGUF\"", b[:4])
	}
	d.off = 4

	version, ok := d.u32()
	if !ok {
		return nil, d.truncated(4, "version")
	}
	switch {
	case version == 2 || version == 3:
	case version == 1:
		return nil, d.errAt(4, "GGUF version 1 is not supported (it uses 32-bit counts); convert the file to version 3")
	case version == 0:
		return nil, d.errAt(4, "bad GGUF version 0")
	case version&0xFFFF == 0:
		return nil, d.errAt(4, "version field 0x%08x looks byte-swapped: big-endian GGUF files are not supported", version)
	default:
		return nil, d.errAt(4, "unsupported GGUF version %d (supported: 2, 3)", version)
	}

	nTensorsU, ok := d.u64()
	if !ok {
		return nil, d.truncated(8, "tensor count")
	}
	nKVU, ok := d.u64()
	if !ok {
		return nil, d.truncated(8, "metadata count")
	}
	if limit := uint64(d.left() / minTensorInfo); nTensorsU > limit {
		return nil, d.errAt(8, "tensor count %d: the %d bytes after the header hold at most %d tensor infos",
			nTensorsU, d.left(), limit)
	}
	if limit := uint64(d.left() / minKVSize); nKVU > limit {
		return nil, d.errAt(16, "metadata count %d: the %d bytes after the header hold at most %d entries",
			nKVU, d.left(), limit)
	}
	nTensors, nKV := int(nTensorsU), int(nKVU)

	f := &File{
		Version:   version,
		Alignment: DefaultAlignment,
		KVs:       make([]KV, 0, min(nKV, 256)),
		kvIndex:   make(map[string]int, min(nKV, 256)),
	}

	alignOff := 0
	for i := 0; i < nKV; i++ {
		keyOff := d.off
		kb, e := d.str("key")
		if e != nil {
			return nil, prefix(e, "metadata entry %d: ", i)
		}
		if len(kb) == 0 {
			return nil, d.errAt(keyOff, "metadata entry %d at offset %d: empty key", i, keyOff)
		}
		key := string(kb)
		if j, dup := f.kvIndex[key]; dup {
			return nil, d.errAt(keyOff, "metadata entry %d at offset %d: duplicate key %q (first is entry %d)",
				i, keyOff, key, j)
		}
		t, ok := d.u32()
		if !ok {
			return nil, prefix(d.truncated(4, "value type"), "metadata %q: ", key)
		}
		v, e := d.value(ValueType(t), d.off-4, 0)
		if e != nil {
			return nil, prefix(e, "metadata %q: ", key)
		}
		if key == "general.alignment" {
			alignOff = keyOff
		}
		f.kvIndex[key] = len(f.KVs)
		f.KVs = append(f.KVs, KV{Key: key, Value: v})
	}

	if v, ok := f.Value("general.alignment"); ok {
		a, isU32 := v.V.(uint32)
		if !isU32 || v.Type != Uint32 {
			return nil, d.errAt(alignOff, "general.alignment at offset %d has type %v, want uint32", alignOff, v.Type)
		}
		if a == 0 || a&(a-1) != 0 {
			return nil, d.errAt(alignOff, "general.alignment %d at offset %d is not a power of two", a, alignOff)
		}
		f.Alignment = int64(a)
	}

	f.Tensors = make([]TensorInfo, 0, min(nTensors, 1024))
	f.tensorIdx = make(map[string]int, min(nTensors, 1024))
	for i := 0; i < nTensors; i++ {
		t, e := d.tensorInfo(i, f.Alignment)
		if e != nil {
			return nil, e
		}
		if j, dup := f.tensorIdx[t.Name]; dup {
			return nil, d.errAt(d.off, "tensor %d: duplicate name %q (first is tensor %d)", i, t.Name, j)
		}
		f.tensorIdx[t.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}

	// The data section starts at the next multiple of the alignment; a file without tensors need
	// not carry the padding.
	start := int64(d.off)
	if nTensors > 0 {
		start = alignUp(start, f.Alignment)
		if start > int64(len(b)) {
			return nil, d.errAt(d.off, "data section would start at offset %d, past the end of the %d-byte file",
				start, len(b))
		}
	}
	f.dataOffset = start
	if e := checkLayout(f.Tensors, int64(len(b))-start, start); e != nil {
		return nil, e
	}
	f.data = b
	return f, nil
}

func alignUp(n, a int64) int64 { return (n + a - 1) &^ (a - 1) }

// tensorInfo reads the i-th tensor-info record.
func (d *decoder) tensorInfo(i int, align int64) (TensorInfo, *FormatError) {
	var t TensorInfo
	recOff := d.off
	nb, e := d.str("name")
	if e != nil {
		return t, prefix(e, "tensor %d: ", i)
	}
	if len(nb) > MaxNameLen {
		return t, d.errAt(recOff, "tensor %d at offset %d: name is %d bytes long, the limit is %d",
			i, recOff, len(nb), MaxNameLen)
	}
	t.Name = string(nb)

	nDims, ok := d.u32()
	if !ok {
		return t, prefix(d.truncated(4, "dimension count"), "tensor %q: ", t.Name)
	}
	if nDims > MaxDims {
		return t, d.errAt(d.off-4, "tensor %q: %d dimensions, the limit is %d", t.Name, nDims, MaxDims)
	}
	var dims [MaxDims]int64
	for j := 0; j < int(nDims); j++ {
		u, ok := d.u64()
		if !ok {
			return t, prefix(d.truncated(8, fmt.Sprintf("dimension %d", j)), "tensor %q: ", t.Name)
		}
		if u > math.MaxInt64 {
			return t, d.errAt(d.off-8, "tensor %q: dimension %d is negative (%d)", t.Name, j, int64(u))
		}
		dims[j] = int64(u)
	}
	if nDims == 0 {
		dims[0], nDims = 1, 1
	}
	t.Shape = append([]int64(nil), dims[:nDims]...)

	// The element count must be representable; a tensor with a zero dimension has none.
	rows := int64(1)
	for j := 1; j < int(nDims); j++ {
		if dims[j] != 0 && rows > math.MaxInt64/dims[j] {
			return t, d.errAt(recOff, "tensor %q: element count of shape %v overflows int64", t.Name, t.Shape)
		}
		rows *= dims[j]
	}
	if rows != 0 && dims[0] > math.MaxInt64/rows {
		return t, d.errAt(recOff, "tensor %q: element count of shape %v overflows int64", t.Name, t.Shape)
	}

	dt, ok := d.u32()
	if !ok {
		return t, prefix(d.truncated(4, "dtype"), "tensor %q: ", t.Name)
	}
	t.DType = tensor.DType(dt)
	if !t.DType.Known() {
		return t, d.errAt(d.off-4, "tensor %q: unknown dtype id %d", t.Name, dt)
	}
	if bs := int64(t.DType.BlockSize()); dims[0]%bs != 0 {
		return t, d.errAt(recOff, "tensor %q: row of %d elements is not a multiple of the %v block size %d",
			t.Name, dims[0], t.DType, bs)
	}
	rowSize, err := t.DType.RowSize(dims[0])
	if err != nil {
		return t, d.errAt(recOff, "tensor %q: %v", t.Name, err)
	}
	if rows != 0 && rowSize > math.MaxInt64/rows {
		return t, d.errAt(recOff, "tensor %q: byte size of shape %v overflows int64", t.Name, t.Shape)
	}
	t.Size = rowSize * rows

	off, ok := d.u64()
	if !ok {
		return t, prefix(d.truncated(8, "data offset"), "tensor %q: ", t.Name)
	}
	if off > math.MaxInt64 {
		return t, d.errAt(d.off-8, "tensor %q: data offset %d is out of range", t.Name, off)
	}
	if int64(off)%align != 0 {
		return t, d.errAt(d.off-8, "tensor %q: data offset %d is not a multiple of the alignment %d",
			t.Name, off, align)
	}
	t.Offset = int64(off)
	return t, nil
}

// checkLayout checks that every tensor lies within the avail bytes of the data section (which
// starts at file offset base) and that no two tensors share a byte.
func checkLayout(ts []TensorInfo, avail, base int64) *FormatError {
	for i := range ts {
		t := &ts[i]
		if t.Offset > avail || t.Size > avail-t.Offset {
			return &FormatError{Offset: base + min(t.Offset, avail), Msg: fmt.Sprintf(
				"tensor %q: data [%d, %d) of the data section runs past its end at %d (file offset %d)",
				t.Name, t.Offset, uint64(t.Offset)+uint64(t.Size), avail, base+avail)}
		}
	}
	order := make([]int, 0, len(ts))
	for i := range ts {
		if ts[i].Size > 0 {
			order = append(order, i)
		}
	}
	sort.Slice(order, func(a, b int) bool { return ts[order[a]].Offset < ts[order[b]].Offset })
	for k := 1; k < len(order); k++ {
		p, q := &ts[order[k-1]], &ts[order[k]]
		if p.Offset+p.Size > q.Offset {
			return &FormatError{Offset: base + q.Offset, Msg: fmt.Sprintf(
				"tensors %q [%d, %d) and %q [%d, %d) overlap in the data section",
				p.Name, p.Offset, p.Offset+p.Size, q.Name, q.Offset, q.Offset+q.Size)}
		}
	}
	return nil
}

// value reads a value of type t whose type field was at typeOff. depth counts enclosing arrays.
func (d *decoder) value(t ValueType, typeOff, depth int) (Value, *FormatError) {
	v := Value{Type: t}
	le := binary.LittleEndian
	if t != String && t != Array {
		n := t.minSize()
		if n == 0 {
			return v, d.errAt(typeOff, "invalid value type %d at offset %d", uint32(t), typeOff)
		}
		if d.left() < n {
			return v, d.truncated(n, t.String()+" value")
		}
		p := d.b[d.off:]
		switch t {
		case Uint8:
			v.V = p[0]
		case Int8:
			v.V = getInt8(p)
		case Bool:
			v.V = getBool(p)
		case Uint16:
			v.V = le.Uint16(p)
		case Int16:
			v.V = getInt16(p)
		case Uint32:
			v.V = le.Uint32(p)
		case Int32:
			v.V = getInt32(p)
		case Float32:
			v.V = getFloat32(p)
		case Uint64:
			v.V = le.Uint64(p)
		case Int64:
			v.V = getInt64(p)
		case Float64:
			v.V = getFloat64(p)
		}
		d.off += n
		return v, nil
	}
	if t == String {
		s, e := d.str("string")
		if e != nil {
			return v, e
		}
		v.V = string(s)
		return v, nil
	}
	return d.array(typeOff, depth)
}

// array reads an array's element type, count and elements.
func (d *decoder) array(typeOff, depth int) (Value, *FormatError) {
	v := Value{Type: Array}
	et, ok := d.u32()
	if !ok {
		return v, d.truncated(4, "array element type")
	}
	elem := ValueType(et)
	v.Elem = elem
	size := elem.minSize()
	if size == 0 {
		return v, d.errAt(d.off-4, "invalid array element type %d at offset %d", et, d.off-4)
	}
	if elem == Array && depth+1 >= maxNesting {
		return v, d.errAt(d.off-4, "arrays nested more than %d deep at offset %d", maxNesting, d.off-4)
	}
	countOff := d.off
	n64, ok := d.u64()
	if !ok {
		return v, d.truncated(8, "array count")
	}
	if limit := uint64(d.left() / size); n64 > limit {
		return v, d.errAt(countOff, "array count %d of %v at offset %d: the %d bytes left hold at most %d",
			n64, elem, countOff, d.left(), limit)
	}
	n := int(n64)
	le := binary.LittleEndian
	p := d.b[d.off:]
	switch elem {
	case Uint8:
		v.V = append(make([]uint8, 0, n), p[:n]...)
	case Int8:
		v.V = decodeElems(p, n, size, getInt8)
	case Bool:
		v.V = decodeElems(p, n, size, getBool)
	case Uint16:
		v.V = decodeElems(p, n, size, le.Uint16)
	case Int16:
		v.V = decodeElems(p, n, size, getInt16)
	case Uint32:
		v.V = decodeElems(p, n, size, le.Uint32)
	case Int32:
		v.V = decodeElems(p, n, size, getInt32)
	case Float32:
		v.V = decodeElems(p, n, size, getFloat32)
	case Uint64:
		v.V = decodeElems(p, n, size, le.Uint64)
	case Int64:
		v.V = decodeElems(p, n, size, getInt64)
	case Float64:
		v.V = decodeElems(p, n, size, getFloat64)
	case String:
		s, e := d.strings(n)
		if e != nil {
			return v, e
		}
		v.V = s
		return v, nil
	case Array:
		s := make([]Value, 0, min(n, 64))
		for i := 0; i < n; i++ {
			a, e := d.array(d.off, depth+1)
			if e != nil {
				return v, prefix(e, "array element %d: ", i)
			}
			s = append(s, a)
		}
		v.V = s
		return v, nil
	}
	d.off += n * size
	return v, nil
}

// decodeElems decodes n elements of size bytes each from p with get.
func decodeElems[T any](p []byte, n, size int, get func([]byte) T) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = get(p[size*i:])
	}
	return s
}

// The little-endian decodings of GGUF's fixed-size types, shared by single values and arrays.
func getInt8(p []byte) int8       { return int8(p[0]) }
func getBool(p []byte) bool       { return p[0] != 0 }
func getInt16(p []byte) int16     { return int16(binary.LittleEndian.Uint16(p)) }
func getInt32(p []byte) int32     { return int32(binary.LittleEndian.Uint32(p)) }
func getInt64(p []byte) int64     { return int64(binary.LittleEndian.Uint64(p)) }
func getFloat32(p []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(p)) }
func getFloat64(p []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(p)) }

// strings reads n length-prefixed strings. A first pass checks every length against the bytes
// left; the second copies all string bytes into one buffer that the strings share, so a
// vocabulary of n tokens costs two allocations, not n.
func (d *decoder) strings(n int) ([]string, *FormatError) {
	off, total := d.off, 0
	for i := 0; i < n; i++ {
		if len(d.b)-off < 8 {
			d.off = off
			return nil, prefix(d.truncated(8, "string length"), "array element %d: ", i)
		}
		l := binary.LittleEndian.Uint64(d.b[off:])
		off += 8
		if l > uint64(len(d.b)-off) {
			return nil, d.errAt(off-8, "array element %d: string at offset %d: length %d exceeds the %d bytes left",
				i, off-8, l, len(d.b)-off)
		}
		off += int(l)
		total += int(l)
	}
	buf := make([]byte, total)
	out := make([]string, n)
	pos := 0
	for i := range out {
		l := int(binary.LittleEndian.Uint64(d.b[d.off:]))
		d.off += 8
		copy(buf[pos:], d.b[d.off:d.off+l])
		if l > 0 {
			out[i] = unsafe.String(&buf[pos], l)
		}
		d.off += l
		pos += l
	}
	return out, nil
}
