package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/gguf"
)

func runInspect(e *env, args []string) error {
	fs := newFlags(e, "inspect", "[--json] [--full] MODEL")
	asJSON := fs.Bool("json", false, `print JSON (float values that are not finite as the strings "NaN", "+Inf" and "-Inf")`)
	full := fs.Bool("full", false, "print arrays in full (default: the first 8 elements)")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one model file, got %d arguments", len(pos))
	}
	path, err := resolveModel(e, pos[0])
	if err != nil {
		return err
	}
	if isGGML, _ := ggml.IsFile(path); isGGML { // a file that cannot be read: the GGUF reader says why
		return inspectGGML(e, path, *asJSON)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	show := func(v gguf.Value) any { return valueSummary(v, *full) }
	if *asJSON {
		type tensorJSON struct {
			Name   string  `json:"name"`
			DType  string  `json:"dtype"`
			Shape  []int64 `json:"shape"`
			Offset int64   `json:"offset"`
			Size   int64   `json:"size"`
		}
		out := struct {
			Version  uint32         `json:"version"`
			Metadata map[string]any `json:"metadata"`
			Tensors  []tensorJSON   `json:"tensors"`
		}{Version: f.Version, Metadata: map[string]any{}}
		for _, kv := range f.KVs {
			out.Metadata[kv.Key] = jsonSafe(show(kv.Value))
		}
		for _, t := range f.Tensors {
			out.Tensors = append(out.Tensors, tensorJSON{t.Name, t.DType.String(), t.Shape, t.Offset, t.Size})
		}
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(e.stdout, "GGUF version %d, %d metadata entries, %d tensors, alignment %d\n\n", f.Version, len(f.KVs), len(f.Tensors), f.Alignment)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	for _, kv := range f.KVs {
		typ := kv.Value.Type.String()
		if kv.Value.Type == gguf.Array {
			typ = fmt.Sprintf("[%d]%s", arrayLen(kv.Value), kv.Value.Elem)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", kv.Key, typ, textValue(show(kv.Value)))
	}
	tw.Flush()
	fmt.Fprintln(e.stdout)
	tw = tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "tensor\tdtype\tshape\toffset\tbytes")
	var total int64
	for _, t := range f.Tensors {
		dims := make([]string, len(t.Shape))
		for i, d := range t.Shape {
			dims[i] = fmt.Sprint(d)
		}
		fmt.Fprintf(tw, "%s\t%s\t[%s]\t%d\t%d\n", t.Name, t.DType, strings.Join(dims, " "), t.Offset, t.Size)
		total += t.Size
	}
	tw.Flush()
	fmt.Fprintf(e.stdout, "\n%d tensors, %.2f MiB of tensor data\n", len(f.Tensors), float64(total)/(1<<20))
	return nil
}

func arrayLen(v gguf.Value) int {
	switch a := v.V.(type) {
	case []string:
		return len(a)
	case []gguf.Value:
		return len(a)
	}
	if s, ok := sliceLen(v.V); ok {
		return s
	}
	return 0
}

func sliceLen(v any) (int, bool) {
	switch a := v.(type) {
	case []uint8:
		return len(a), true
	case []int8:
		return len(a), true
	case []uint16:
		return len(a), true
	case []int16:
		return len(a), true
	case []uint32:
		return len(a), true
	case []int32:
		return len(a), true
	case []float32:
		return len(a), true
	case []bool:
		return len(a), true
	case []uint64:
		return len(a), true
	case []int64:
		return len(a), true
	case []float64:
		return len(a), true
	}
	return 0, false
}

// valueSummary is v as a JSON-friendly value; arrays are cut to their first 8 elements unless
// full.
func valueSummary(v gguf.Value, full bool) any {
	if v.Type != gguf.Array {
		return v.V
	}
	n := arrayLen(v)
	limit := n
	if !full && limit > 8 {
		limit = 8
	}
	var head any
	switch a := v.V.(type) {
	case []string:
		head = a[:limit]
	case []gguf.Value:
		s := make([]any, limit)
		for i := range s {
			s[i] = valueSummary(a[i], full)
		}
		head = s
	case []uint8:
		head = a[:limit]
	case []int8:
		head = a[:limit]
	case []uint16:
		head = a[:limit]
	case []int16:
		head = a[:limit]
	case []uint32:
		head = a[:limit]
	case []int32:
		head = a[:limit]
	case []float32:
		head = a[:limit]
	case []bool:
		head = a[:limit]
	case []uint64:
		head = a[:limit]
	case []int64:
		head = a[:limit]
	case []float64:
		head = a[:limit]
	}
	if limit == n {
		return head
	}
	return map[string]any{"len": n, "head": head}
}

// nonFinite is how NaN and the infinities are written, as text and as JSON strings (JSON has no
// numbers for them).
func nonFinite(f float64) (string, bool) {
	switch {
	case math.IsNaN(f):
		return "NaN", true
	case math.IsInf(f, 1):
		return "+Inf", true
	case math.IsInf(f, -1):
		return "-Inf", true
	}
	return "", false
}

// jsonSafe is a valueSummary with every float that is not finite replaced by its nonFinite
// string; values without such floats are returned as they are.
func jsonSafe(x any) any {
	floats := func(n int, at func(int) float64) any {
		out := make([]any, n)
		changed := false
		for i := range out {
			if s, ok := nonFinite(at(i)); ok {
				out[i], changed = s, true
			} else {
				out[i] = at(i)
			}
		}
		if !changed {
			return x
		}
		return out
	}
	switch v := x.(type) {
	case float32:
		if s, ok := nonFinite(float64(v)); ok {
			return s
		}
	case float64:
		if s, ok := nonFinite(v); ok {
			return s
		}
	case []float32:
		return floats(len(v), func(i int) float64 { return float64(v[i]) })
	case []float64:
		return floats(len(v), func(i int) float64 { return v[i] })
	case []any:
		out := make([]any, len(v))
		for i := range v {
			out[i] = jsonSafe(v[i])
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = jsonSafe(e)
		}
		return out
	}
	return x
}

// textValue is a valueSummary as inspect's text table shows it: JSON, except that floats that
// are not finite are written bare (NaN, +Inf, -Inf).
func textValue(x any) string {
	join := func(open, close string, n int, at func(int) string) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = at(i)
		}
		return open + strings.Join(parts, ",") + close
	}
	switch v := x.(type) {
	case float32:
		if s, ok := nonFinite(float64(v)); ok {
			return s
		}
	case float64:
		if s, ok := nonFinite(v); ok {
			return s
		}
	case []float32:
		return join("[", "]", len(v), func(i int) string { return textValue(v[i]) })
	case []float64:
		return join("[", "]", len(v), func(i int) string { return textValue(v[i]) })
	case []any:
		return join("[", "]", len(v), func(i int) string { return textValue(v[i]) })
	case map[string]any: // {"head": [...], "len": n}: keys sorted, as json.Marshal writes them
		keys := slices.Sorted(maps.Keys(v))
		return join("{", "}", len(keys), func(i int) string { return textValue(keys[i]) + ":" + textValue(v[keys[i]]) })
	}
	b, err := json.Marshal(x)
	if err != nil {
		return fmt.Sprint(x)
	}
	return string(b)
}

// inspectGGML prints a whisper.cpp model file's header, filter bank and vocabulary sizes and its
// tensor table.
func inspectGGML(e *env, path string, asJSON bool) error {
	f, err := ggml.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	names, values := f.HParams.Fields()
	type tensorJSON struct {
		Name   string `json:"name"`
		DType  string `json:"dtype"`
		Shape  []int  `json:"shape"`
		Offset int64  `json:"offset"`
		Size   int    `json:"size"`
	}
	if asJSON {
		out := struct {
			Format     string         `json:"format"`
			HParams    map[string]int `json:"hparams"`
			MelFilters [2]int         `json:"mel_filters"`
			VocabSize  int            `json:"vocab_size"`
			Tensors    []tensorJSON   `json:"tensors"`
		}{Format: "ggml", HParams: map[string]int{}, MelFilters: [2]int{f.Filters.NMel, f.Filters.NFFT}, VocabSize: len(f.Vocab)}
		for i, n := range names {
			out.HParams[n] = values[i]
		}
		for _, t := range f.Tensors {
			out.Tensors = append(out.Tensors, tensorJSON{t.Name, t.Type.String(), t.Ne, t.Offset, len(t.Data)})
		}
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(e.stdout, "whisper.cpp ggml file, %d tensors; mel filters %d × %d; %d tokens stored\n\n", len(f.Tensors), f.Filters.NMel, f.Filters.NFFT, len(f.Vocab))
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	for i, n := range names {
		fmt.Fprintf(tw, "%s\t%d\n", n, values[i])
	}
	tw.Flush()
	fmt.Fprintln(e.stdout)
	tw = tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "tensor\tdtype\tshape\toffset\tbytes")
	total := 0
	for _, t := range f.Tensors {
		dims := make([]string, len(t.Ne))
		for i, d := range t.Ne {
			dims[i] = fmt.Sprint(d)
		}
		fmt.Fprintf(tw, "%s\t%s\t[%s]\t%d\t%d\n", t.Name, t.Type, strings.Join(dims, " "), t.Offset, len(t.Data))
		total += len(t.Data)
	}
	tw.Flush()
	fmt.Fprintf(e.stdout, "\n%d tensors, %.2f MiB of tensor data\n", len(f.Tensors), float64(total)/(1<<20))
	return nil
}
