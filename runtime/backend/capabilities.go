package backend

import (
	"fmt"
	"math/bits"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Op names an optional operation: one a backend may have or not, each the method of an interface
// of its own, which callers find by a type assertion or by Supports.
type Op uint8

const (
	OpMatMuls        Op = iota + 1 // MultiMatMuler: products of one x with several matrices in one call
	OpArgmax                       // Argmaxer: the largest logit of rows, where the logits are
	OpDraw                         // Drawer: tokens drawn where the logits are
	OpChoose                       // Chooser: a decoder's filtered best tokens, where the logits are
	OpRecord                       // Recorder: operations recorded and replayed as one unit
	OpRepack                       // Repacker: weights rearranged into a faster layout
	OpFreeMemory                   // MemoryReporter: the free memory of a device
	OpGreedyDecoding               // GreedyTransducer: a transducer's greedy decoding kept where the logits are
	numOps
)

var opNames = [numOps]string{OpMatMuls: "matmuls", OpArgmax: "argmax", OpDraw: "draw", OpChoose: "choose",
	OpRecord: "record", OpRepack: "repack", OpFreeMemory: "free memory", OpGreedyDecoding: "greedy decoding"}

func (op Op) String() string {
	if op > 0 && op < numOps {
		return opNames[op]
	}
	return fmt.Sprintf("op(%d)", uint8(op))
}

// Ops lists every optional operation.
func Ops() []Op {
	ops := make([]Op, 0, numOps-1)
	for op := Op(1); op < numOps; op++ {
		ops = append(ops, op)
	}
	return ops
}

// has reports whether be implements op's interface.
func (op Op) has(be Backend) bool {
	var ok bool
	switch op {
	case OpMatMuls:
		_, ok = be.(MultiMatMuler)
	case OpArgmax:
		_, ok = be.(Argmaxer)
	case OpDraw:
		_, ok = be.(Drawer)
	case OpChoose:
		_, ok = be.(Chooser)
	case OpRecord:
		_, ok = be.(Recorder)
	case OpRepack:
		_, ok = be.(Repacker)
	case OpFreeMemory:
		_, ok = be.(MemoryReporter)
	case OpGreedyDecoding:
		_, ok = be.(GreedyTransducer)
	}
	return ok
}

// Set is a set of small values (operations, functions, dtype ids below 64), one bit each.
type Set[E ~uint8 | ~int32 | ~uint32] uint64

// SetOf returns the set of es.
func SetOf[E ~uint8 | ~int32 | ~uint32](es ...E) Set[E] {
	var s Set[E]
	for _, e := range es {
		s = s.With(e)
	}
	return s
}

// With returns s with e added. A Set holds values below 64; With leaves s as it is for others.
func (s Set[E]) With(e E) Set[E] {
	if uint64(e) >= 64 {
		return s
	}
	return s | 1<<uint64(e)
}

// Has reports whether e is in s.
func (s Set[E]) Has(e E) bool { return uint64(e) < 64 && s&(1<<uint64(e)) != 0 }

// Len is the number of members of s.
func (s Set[E]) Len() int { return bits.OnesCount64(uint64(s)) }

// Members lists the members of s in increasing order.
func (s Set[E]) Members() []E {
	es := make([]E, 0, s.Len())
	for v := uint64(s); v != 0; v &= v - 1 {
		es = append(es, E(bits.TrailingZeros64(v)))
	}
	return es
}

// Capabilities is what a backend can do beyond what every backend does, stated as data that
// callers and the conformance suite read (CapabilitiesOf, Supports), as ggml's backends answer
// supports_op: which optional operations it has, and which of the cases that an operation every
// backend has may take it computes. The shared operand checks (Operands) refuse the cases a
// backend does not state, with ErrUnsupported, so that a backend leaves a case out by saying so,
// without code.
type Capabilities struct {
	// Ops are the optional operations: the interfaces among MultiMatMuler, Argmaxer, Drawer,
	// Chooser, Recorder, Repacker and MemoryReporter the backend implements. CapabilitiesOf reads
	// them off the backend's methods, so that a wrapper that hides or adds one says so by its
	// methods alone; a backend leaves them out of what it returns.
	Ops Set[Op]
	// Funcs are the functions Unary and GLU compute (all of tensor.Funcs, for Parley's backends).
	Funcs Set[Func]
	// Weights are the types Load takes and MatMul and GetRows multiply and read.
	Weights Set[tensor.DType]
	// KV are the types of the caches NewKV makes.
	KV Set[tensor.DType]
}

// CapabilitiesOf returns what be can do: what it states (Backend.Capabilities), with the
// optional operations it implements.
func CapabilitiesOf(be Backend) Capabilities {
	c := be.Capabilities()
	c.Ops = 0
	for op := Op(1); op < numOps; op++ {
		if op.has(be) {
			c.Ops = c.Ops.With(op)
		}
	}
	return c
}

// Supports reports whether be has the optional operation op.
func Supports(be Backend, op Op) bool { return op.has(be) }

// DTypes returns the set of dtype ids below 64 for which has reports true (a backend's weight
// or cache types, from the native library's own answer).
func DTypes(has func(tensor.DType) bool) Set[tensor.DType] {
	var s Set[tensor.DType]
	for dt := tensor.DType(0); dt < 64; dt++ {
		if dt.Known() && has(dt) {
			s = s.With(dt)
		}
	}
	return s
}
