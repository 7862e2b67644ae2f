// Package docker checks the repository's Dockerfiles without Docker: each is parsed and linted
// with BuildKit's own Dockerfile front end, and its stages, user, health check and ports are
// checked against what the image must do.
package docker

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// repoRoot returns the directory holding go.mod.
func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Dir(file)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test")
		}
		dir = parent
	}
}

// parsed is a Dockerfile after BuildKit's parser and instruction parser, with every warning
// they and the linter raised.
type parsed struct {
	stages   []instructions.Stage
	metaArgs []instructions.ArgCommand
	warnings []string
}

func parse(t *testing.T, name string) parsed {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot(t), name))
	if err != nil {
		t.Fatal(err)
	}
	res, err := parser.Parse(bytes.NewReader(src))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var p parsed
	for _, w := range res.Warnings {
		p.warnings = append(p.warnings, fmt.Sprintf("parser: %s", w.Short))
	}
	lint := linter.New(&linter.Config{
		ExperimentalAll: true,
		Warn: func(rule, description, url, msg string, loc []parser.Range) {
			line := 0
			if len(loc) > 0 {
				line = loc[0].Start.Line
			}
			p.warnings = append(p.warnings, fmt.Sprintf("line %d: %s: %s (%s)", line, rule, msg, url))
		},
	})
	p.stages, p.metaArgs, err = instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return p
}

// settings is what a stage's instructions set: the last USER, HEALTHCHECK, ENTRYPOINT (and
// whether it is in exec form, run as PID 1) and CMD; every EXPOSE, VOLUME, ENV and RUN; and its
// COPY --from instructions.
type settings struct {
	user             string
	health           *instructions.HealthCheckCommand
	exposed, volumes []string
	entrypoint, cmd  []string
	onPID            bool
	env              map[string]string
	runs             []string
	copies           []*instructions.CopyCommand
}

func settingsOf(s *instructions.Stage) settings {
	st := settings{env: map[string]string{}}
	for _, c := range s.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			st.user = c.User
		case *instructions.HealthCheckCommand:
			st.health = c
		case *instructions.ExposeCommand:
			st.exposed = append(st.exposed, c.Ports...)
		case *instructions.VolumeCommand:
			st.volumes = append(st.volumes, c.Volumes...)
		case *instructions.EntrypointCommand:
			st.entrypoint, st.onPID = c.CmdLine, !c.PrependShell
		case *instructions.CmdCommand:
			st.cmd = c.CmdLine
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				st.env[kv.Key] = kv.Value
			}
		case *instructions.RunCommand:
			st.runs = append(st.runs, strings.Join(c.CmdLine, " "))
		case *instructions.CopyCommand:
			if c.From != "" {
				st.copies = append(st.copies, c)
			}
		}
	}
	return st
}

// TestDockerfileCUDA checks Dockerfile.cuda: no parser or lint warnings; a build stage on a CUDA
// devel image that builds the kernels and the server with the cuda tag; a final stage on a CUDA
// runtime image that runs `parley serve` as a non-root user with a health check on /health,
// the port exposed and a volume for models.
func TestDockerfileCUDA(t *testing.T) {
	p := parse(t, "Dockerfile.cuda")
	for _, w := range p.warnings {
		t.Errorf("Dockerfile.cuda: %s", w)
	}
	if len(p.stages) < 2 {
		t.Fatalf("%d stages, want a build stage and a runtime stage", len(p.stages))
	}
	names := map[string]bool{}
	for _, s := range p.stages {
		if s.Name != "" {
			names[s.Name] = true
		}
		base := p.expand(s.BaseName)
		if strings.Contains(base, "$") {
			t.Errorf("stage %q: base image %q refers to an undefined argument", s.Name, s.BaseName)
		}
		if !strings.Contains(base, ":") || strings.HasSuffix(base, ":latest") {
			t.Errorf("stage %q: base image %q is not pinned to a tag", s.Name, base)
		}
	}

	build := p.stage("build")
	if build == nil {
		t.Fatal("no stage named build")
	}
	if base := p.expand(build.BaseName); !strings.HasPrefix(base, "nvidia/cuda:") || !strings.Contains(base, "-devel-") {
		t.Errorf("build stage is based on %q, want an nvidia/cuda devel image", base)
	}
	runs := strings.Join(settingsOf(build).runs, "\n")
	for _, want := range []string{"scripts/cuda-build", "go build -tags cuda", "./cmd/parley"} {
		if !strings.Contains(runs, want) {
			t.Errorf("build stage never runs %q", want)
		}
	}

	final := &p.stages[len(p.stages)-1]
	if base := p.expand(final.BaseName); !strings.HasPrefix(base, "nvidia/cuda:") || !strings.Contains(base, "-runtime-") {
		t.Errorf("final stage is based on %q, want an nvidia/cuda runtime image", base)
	}
	st := settingsOf(final)
	copiedFromBuild := slices.ContainsFunc(st.copies, func(c *instructions.CopyCommand) bool { return names[c.From] })
	if u := strings.Split(st.user, ":")[0]; u == "" || u == "root" || u == "0" {
		t.Errorf("final stage runs as %q, want a non-root USER", st.user)
	}
	if st.health == nil || st.health.Health == nil || len(st.health.Health.Test) < 2 || st.health.Health.Test[0] == "NONE" {
		t.Error("final stage has no HEALTHCHECK")
	} else if !strings.Contains(strings.Join(st.health.Health.Test, " "), "/health") {
		t.Errorf("HEALTHCHECK %q does not probe /health", st.health.Health.Test)
	}
	if len(st.exposed) == 0 || !strings.HasPrefix(st.exposed[0], "8080") {
		t.Errorf("final stage exposes %q, want 8080", st.exposed)
	}
	if len(st.volumes) == 0 || st.volumes[0] != "/models" {
		t.Errorf("final stage declares volumes %q, want /models", st.volumes)
	}
	if !copiedFromBuild {
		t.Error("final stage copies nothing from an earlier stage")
	}
	if !st.onPID || len(st.entrypoint) == 0 || !strings.HasSuffix(st.entrypoint[0], "parley") {
		t.Errorf("ENTRYPOINT %q, want the parley binary in exec form", st.entrypoint)
	}
	if len(st.cmd) == 0 || st.cmd[0] != "serve" {
		t.Errorf("CMD %q, want serve", st.cmd)
	}
}

// TestDockerignore checks that the build context leaves out what the image must not carry.
func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			have[strings.TrimPrefix(l, "/")] = true
		}
	}
	for _, want := range []string{".git", "build", "shared"} {
		if !have[want] {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
}
