package tests

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// parleyEnv runs parley with extra environment variables.
func parleyEnv(t testing.TB, env []string, args ...string) result {
	t.Helper()
	return runParley(t, env, "", args)
}

// TestCLIEnvironment: every flag of every command is read from PARLEY_<NAME> when the command
// line does not give it, parsed and checked as the flag is: a bad value exits 2 and names the
// flag and the variable.
func TestCLIEnvironment(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	for _, c := range []struct {
		name string
		env  []string
		args []string
		code int
		want string // in stderr, once
	}{
		{"port not a number", []string{"PARLEY_PORT=abc"}, []string{"serve", "-m", model}, 2, `invalid value "abc" for flag -port from $PARLEY_PORT`},
		{"port out of range", []string{"PARLEY_PORT=99999"}, []string{"serve", "-m", model}, 2, "$PARLEY_PORT 99999: want a port number from 0 to 65535"},
		{"boolean not a boolean", []string{"PARLEY_PREFIX_CACHE=maybe"}, []string{"serve", "-m", model, "--port", "0"}, 2, `invalid value "maybe" for flag -prefix-cache from $PARLEY_PREFIX_CACHE`},
		{"duration not a duration", []string{"PARLEY_TIMEOUT=soon"}, []string{"serve", "-m", model, "--port", "0"}, 2, `invalid value "soon" for flag -timeout from $PARLEY_TIMEOUT`},
		{"grace not a duration", []string{"PARLEY_SHUTDOWN_GRACE=1"}, []string{"serve", "-m", model, "--port", "0"}, 2, "$PARLEY_SHUTDOWN_GRACE"},
		{"log format", []string{"PARLEY_LOG_FORMAT=xml"}, []string{"serve", "-m", model, "--port", "0"}, 2, `--log-format "xml"`},
		{"generate reads its variables", []string{"PARLEY_N_PREDICT=many"}, []string{"generate", "-m", model, "-p", "x"}, 2, `invalid value "many" for flag -n-predict from $PARLEY_N_PREDICT`},
		{"generate temperature", []string{"PARLEY_TEMP=-1"}, []string{"generate", "-m", model, "-p", "x"}, 2, "$PARLEY_TEMP -1: Invalid 'temperature': expected a value in [0, 2], but got -1 instead."},
		{"the command line wins", []string{"PARLEY_TEMP=-1"}, []string{"generate", "-m", model, "-p", "x", "--temp", "0", "-n", "1", "--backend", "go"}, 0, "stop: length"},
		{"transcribe reads its variables", []string{"PARLEY_BEAM=wide"}, []string{"transcribe", "-m", model, "a.wav"}, 2, "$PARLEY_BEAM"},
		{"model from the variable", []string{"PARLEY_MODEL=" + model}, []string{"tokenize", "Hello"}, 0, ""},
		{"threads", []string{"PARLEY_THREADS=-3"}, []string{"generate", "-m", model, "-p", "x"}, 2, "-t -3 (from $PARLEY_THREADS): thread count must not be negative"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := parleyEnv(t, c.env, c.args...)
			if res.code != c.code || c.want != "" && strings.Count(res.stderr, c.want) != 1 {
				t.Errorf("exit %d, want %d with %q once; stderr:\n%s", res.code, c.code, c.want, res.stderr)
			}
		})
	}
	// A boolean variable takes what strconv.ParseBool takes: 1, true, 0, false...
	res := parleyEnv(t, []string{"PARLEY_JSON=1"}, "inspect", model)
	if res.code != 0 || !json.Valid([]byte(res.stdout)) {
		t.Errorf("PARLEY_JSON=1 inspect: exit %d, stdout not JSON: %.200s %s", res.code, res.stdout, res.stderr)
	}
	res = parleyEnv(t, []string{"PARLEY_JSON=0"}, "inspect", model)
	if res.code != 0 || json.Valid([]byte(res.stdout)) {
		t.Errorf("PARLEY_JSON=0 inspect: exit %d, stdout JSON: %.200s %s", res.code, res.stdout, res.stderr)
	}
	// --help names every flag's variable.
	res = parley(t, "", "serve", "--help")
	for _, v := range []string{"$PARLEY_MODEL", "$PARLEY_THREADS", "$PARLEY_PREFIX_CACHE", "$PARLEY_KV_MEM", "$PARLEY_CHAT_TEMPLATE", "$PARLEY_ALLOWED_HOSTS"} {
		if !strings.Contains(res.stderr, v) {
			t.Errorf("serve --help does not name %s:\n%s", v, res.stderr)
		}
	}
}

// TestVersion: parley version and --version say the version, the Go that built it, the
// backends compiled in and the processor's features.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		res := parley(t, "", args...)
		if res.code != 0 {
			t.Fatalf("%v: exit %d %s", args, res.code, res.stderr)
		}
		for _, want := range []string{"parley ", "commit:", "go:         " + runtime.Version(), "build tags:", "backends:", "cpu:", "features:"} {
			if !strings.Contains(res.stdout, want) {
				t.Errorf("%v: no %q in\n%s", args, want, res.stdout)
			}
		}
		for _, b := range backends() {
			if !strings.Contains(res.stdout, b) {
				t.Errorf("%v: backend %s not named:\n%s", args, b, res.stdout)
			}
		}
		if buildTags == "cuda" && !strings.Contains(res.stdout, "  cuda") {
			t.Errorf("%v: the cuda build does not describe its GPUs:\n%s", args, res.stdout)
		}
	}
}
