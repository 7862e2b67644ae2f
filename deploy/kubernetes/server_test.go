package kubernetes

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
)

// flagInfo is one flag of `parley serve --help`.
type flagInfo struct {
	typ   string // int, string, duration, value...; "" for a boolean
	def   string // the default the help shows, "" if none
	usage string
}

// serverFacts is what the manifests must agree with, read from the server itself.
type serverFacts struct {
	flags       map[string]flagInfo // by name, without dashes
	help        string              // the whole help text
	healthPath  string              // answered 200 by a server that has loaded its models
	metricsPath string              // answered with the Prometheus text format
	metrics     map[string]bool     // metric families of a live server's /metrics
	imageUID    int64               // the USER of every image (Dockerfile, Dockerfile.cuda)
	cuda        bool                // the binary has the CUDA backend
}

var (
	binDir  string
	binOnce sync.Once
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// parleyBinary builds cmd/parley from this tree once: the pure-Go build, which has the serve
// command, flags and metrics of every build and compiles fastest.
func parleyBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "parley-deploy"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "parley")
		cmd := exec.Command("go", "build", "-tags", "nocgo", "-o", binPath, "./cmd/parley")
		cmd.Dir = repoRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/parley: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// cleanEnv is the test's environment without PARLEY_* variables, so that the help shows the
// server's own defaults and a run sees only what a test gives it.
func cleanEnv(extra map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PARLEY_") && !strings.HasPrefix(kv, "HF_") {
			env = append(env, kv)
		}
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

var (
	goFlagLine    = regexp.MustCompile(`^  -(-?[A-Za-z0-9][A-Za-z0-9-]*)(?: ([A-Za-z0-9]+))?(?:\t(.*))?$`)
	posixFlagLine = regexp.MustCompile(`^\s+(?:-[A-Za-z0-9], )?--([A-Za-z0-9][A-Za-z0-9-]*)(?:[ =]([A-Za-z0-9]+))?(?:\s{2,}(.*))?$`)
	defaultRE     = regexp.MustCompile(`\(default (.*)\)\s*$`)
)

// parseHelp reads the flags of a command's help: Go's flag package layout ("  -name type" and the
// usage on the next lines), or the --name layout of POSIX-style parsers.
func parseHelp(text string) map[string]flagInfo {
	flags := map[string]flagInfo{}
	var cur string
	add := func(usage string) {
		if cur == "" {
			return
		}
		f := flags[cur]
		f.usage = strings.TrimSpace(f.usage + " " + strings.TrimSpace(usage))
		if m := defaultRE.FindStringSubmatch(f.usage); m != nil {
			f.def = strings.Trim(m[1], `"`)
		}
		flags[cur] = f
	}
	for _, line := range strings.Split(text, "\n") {
		m := goFlagLine.FindStringSubmatch(line)
		if m == nil {
			m = posixFlagLine.FindStringSubmatch(line)
		}
		if m != nil {
			cur = strings.TrimPrefix(m[1], "-")
			flags[cur] = flagInfo{typ: m[2]}
			add(m[3])
			continue
		}
		if strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t") {
			add(line)
		} else {
			cur = ""
		}
	}
	return flags
}

// envFlag returns the flag $name sets: PARLEY_SHUTDOWN_GRACE is --shutdown-grace.
func envFlag(name string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "PARLEY_")), "_", "-")
}

var (
	factsOnce sync.Once
	facts     serverFacts
	factsErr  error
)

// liveFacts reads the server's flags from `parley serve --help`, then runs `parley serve` on a
// synthetic model with the base manifests' settings and reads the health and metrics endpoints
// as the probes, Prometheus and the endpoint picker do.
func liveFacts(t testing.TB) serverFacts {
	t.Helper()
	bin := parleyBinary(t)
	factsOnce.Do(func() { facts, factsErr = readFacts(t, bin) })
	if factsErr != nil {
		t.Fatal(factsErr)
	}
	return facts
}

func readFacts(t testing.TB, bin string) (serverFacts, error) {
	f := serverFacts{healthPath: "/health", metricsPath: "/metrics"}
	cmd := exec.Command(bin, "serve", "--help")
	cmd.Env = cleanEnv(nil)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return f, fmt.Errorf("parley serve --help: %v\n%s", err, out)
	}
	f.help = string(out)
	f.flags = parseHelp(f.help)
	for _, name := range []string{"port", "host", "shutdown-grace", "timeout", "m", "kv-mem"} {
		if _, ok := f.flags[name]; !ok {
			return f, fmt.Errorf("parley serve --help lists no --%s:\n%s", name, out)
		}
	}
	f.cuda = strings.Contains(f.flags["backend"].usage, "cuda")
	if f.imageUID, err = imageUID(repoRoot(t)); err != nil {
		return f, err
	}

	// A model with random weights in the smallest LLaMA shape.
	modelPath := filepath.Join(binDir, "synth.gguf")
	synth := exec.Command(bin, "synth", "--shape", "15M", "--type", "q8_0", "-o", modelPath)
	synth.Env = cleanEnv(nil)
	if out, err := synth.CombinedOutput(); err != nil {
		return f, fmt.Errorf("parley synth: %v\n%s", err, out)
	}
	env, err := baseSettings(t)
	if err != nil {
		return f, err
	}
	port, err := freePort()
	if err != nil {
		return f, err
	}
	// The base's settings, but for where to listen, what to serve, and a KV cache and context
	// that suit the small model.
	env["PARLEY_HOST"], env["PARLEY_PORT"] = "127.0.0.1", strconv.Itoa(port)
	env["PARLEY_MODEL"] = "synth=" + modelPath
	env["PARLEY_CACHE"] = filepath.Join(binDir, "cache")
	env["PARLEY_CTX"], env["PARLEY_PARALLEL"], env["PARLEY_KV_MEM"] = "256", "2", "16"
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := exec.CommandContext(ctx, bin, "serve")
	srv.Env = cleanEnv(env)
	var logs strings.Builder
	srv.Stderr = &logs
	if err := srv.Start(); err != nil {
		return f, err
	}
	defer func() {
		srv.Process.Signal(os.Interrupt)
		srv.Wait()
	}()
	for {
		resp, err := http.Get(base + f.healthPath)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if ctx.Err() != nil {
			return f, fmt.Errorf("GET %s never answered 200: %v\n%s", f.healthPath, err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.Get(base + f.metricsPath)
	if err != nil {
		return f, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return f, fmt.Errorf("GET %s: %s", f.metricsPath, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return f, fmt.Errorf("GET %s: %v", f.metricsPath, err)
	}
	f.metrics = map[string]bool{}
	for name := range fams {
		f.metrics[name] = true
	}
	return f, nil
}

// baseSettings returns the PARLEY_* settings of the base's ConfigMap, as rendered.
func baseSettings(t testing.TB) (map[string]string, error) {
	for _, o := range all[corev1.ConfigMap](kustomize(t, "base")) {
		if strings.HasPrefix(o.Name, "parley") {
			env := map[string]string{}
			for k, v := range o.Data {
				if strings.HasPrefix(k, "PARLEY_") {
					env[k] = v
				}
			}
			return env, nil
		}
	}
	return nil, errors.New("the base renders no ConfigMap parley")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// imageUID returns the numeric USER of the final stages of the repository's Dockerfiles, which
// must all be the same.
func imageUID(root string) (int64, error) {
	userRE := regexp.MustCompile(`^USER\s+(\S+)`)
	var uid int64 = -1
	for _, name := range []string{"Dockerfile", "Dockerfile.cuda"} {
		fh, err := os.Open(filepath.Join(root, name))
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			m := userRE.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			u, _, _ := strings.Cut(m[1], ":")
			n, err := strconv.ParseInt(u, 10, 64)
			if err != nil {
				fh.Close()
				return 0, fmt.Errorf("%s: USER %s is not numeric", name, m[1])
			}
			if uid >= 0 && n != uid {
				fh.Close()
				return 0, fmt.Errorf("%s: USER %d, another image runs as %d", name, n, uid)
			}
			uid = n
		}
		fh.Close()
	}
	if uid < 0 {
		return 0, errors.New("no USER in the Dockerfiles")
	}
	return uid, nil
}

// serveAccepts runs `parley serve` with env (the settings a manifest gives it, the model made a
// file that does not exist) and reports an error unless the server took every setting and failed
// only on the model: exit status 1, not 2, which is a command-line mistake.
func serveAccepts(t testing.TB, env map[string]string) error {
	bin := parleyBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "serve")
	cmd.Env = cleanEnv(env)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out.String(), "no-such-model.gguf") {
		return fmt.Errorf("parley serve with the manifest's settings: %v, want exit status 1 for the missing model alone:\n%s", err, out.String())
	}
	return nil
}
