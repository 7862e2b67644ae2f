package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"golang.org/x/sys/cpu"

	"github.com/parleyhq/parley/runtime/backend"
)

// version and commit may be set at link time (-ldflags "-X main.version=v1.2.3 -X
// main.commit=abc123"); otherwise they come from the build information Go records.
var version, commit string

// runVersion prints what the binary is and what it sees of the machine: its version and commit,
// the Go that built it and the build tags, the backends compiled in with what each would run on
// here (the CPU kernels' instruction set, the GPUs), and the processor's features.
func runVersion(e *env, args []string) error {
	fs := newFlags(e, "version", "")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("unexpected arguments %q", pos)
	}
	v, c, tags, cgo, modified := version, commit, "", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if c == "" {
					c = s.Value
				}
			case "vcs.modified":
				modified = s.Value == "true"
			case "-tags":
				tags = s.Value
			case "CGO_ENABLED":
				cgo = map[string]string{"1": "cgo", "0": "no cgo"}[s.Value]
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	switch {
	case c == "":
		c = "unknown (built without version control information)"
	case modified:
		c += " (with uncommitted changes)"
	}
	if tags == "" {
		tags = "none"
	}
	if cgo != "" {
		tags += " (" + cgo + ")"
	}
	w := e.stdout
	fmt.Fprintf(w, "parley %s\n", v)
	fmt.Fprintf(w, "commit:     %s\n", c)
	fmt.Fprintf(w, "go:         %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(w, "build tags: %s\n", tags)
	fmt.Fprintf(w, "backends:   %s\n", strings.Join(backend.Names(), ", "))
	for _, n := range backend.Names() {
		if info := backend.Info(n); info != "" {
			fmt.Fprintf(w, "  %-8s  %s\n", n, info)
		}
	}
	if why := backend.NotBuilt("cuda"); why != "" {
		fmt.Fprintf(w, "  %-8s  %s\n", "cuda", why)
	}
	fmt.Fprintf(w, "cpu:        %s, %d threads\n", cpuModel(), runtime.NumCPU())
	fmt.Fprintf(w, "features:   %s\n", strings.Join(cpuFeatures(), " "))
	return nil
}

// cpuModel is the processor's name from /proc/cpuinfo, "unknown" where there is none.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// cpuFeatures are the instruction-set extensions that Parley's kernels (native and Go) choose
// between, as the processor reports them.
func cpuFeatures() []string {
	var out []string
	add := func(name string, has bool) {
		if has {
			out = append(out, name)
		}
	}
	switch runtime.GOARCH {
	case "amd64", "386":
		x := cpu.X86
		add("sse4.2", x.HasSSE42)
		add("avx", x.HasAVX)
		add("avx2", x.HasAVX2)
		add("fma", x.HasFMA)
		add("avx512f", x.HasAVX512F)
		add("avx512bw", x.HasAVX512BW)
		add("avx512vl", x.HasAVX512VL)
		add("avx512vnni", x.HasAVX512VNNI)
		add("avx512bf16", x.HasAVX512BF16)
		add("avxvnni", x.HasAVXVNNI)
		add("amx-tile", x.HasAMXTile)
	case "arm64":
		a := cpu.ARM64
		add("asimd", a.HasASIMD)
		add("fphp", a.HasFPHP)
		add("asimdhp", a.HasASIMDHP)
		add("asimddp", a.HasASIMDDP)
		add("sve", a.HasSVE)
		add("sve2", a.HasSVE2)
	}
	if len(out) == 0 {
		out = append(out, "none that Parley's kernels use")
	}
	return out
}
