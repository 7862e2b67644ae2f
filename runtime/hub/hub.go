// Package hub resolves remote model names of the form
//
//	hf://owner/repo/path/in/repo/file.gguf
//	hf://owner/repo@revision/path/in/repo/file.gguf
//
// to local files, downloading each file once from a Hugging Face compatible endpoint into a cache
// directory laid out as {CacheDir}/hf/{owner}/{repo}/{revision}/{path}. A file found complete in
// the cache is used without any network access, so a moving revision such as "main" is fetched
// only the first time.
//
// Downloads go to {final}.partial and are resumed with a Range request when a partial file is
// present. When the server announces a SHA-256 (Hugging Face sends it quoted in X-Linked-Etag or
// ETag for LFS files) the whole file, resumed prefix included, is checked before it is renamed
// into place; the final path therefore only ever holds a complete, verified file. A lock file
// next to the target keeps two processes (or goroutines) from downloading the same file at once.
//
// Revisions containing "/" (such as refs/pr/1) cannot be named.
package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Scheme is the prefix of the names this package resolves.
const Scheme = "hf://"

// DefaultEndpoint is the endpoint used when neither Options.Endpoint nor $PARLEY_HF_ENDPOINT is
// set.
const DefaultEndpoint = "https://huggingface.co"

// Errors returned by Resolve, wrapped with details; test with errors.Is.
var (
	ErrBadName  = errors.New("hub: invalid model name")
	ErrAuth     = errors.New("hub: access denied")
	ErrNotFound = errors.New("hub: no such file")
	ErrChecksum = errors.New("hub: checksum mismatch")
)

// Options configures Resolve. The zero value is usable.
type Options struct {
	// CacheDir is the cache root. Default: $PARLEY_CACHE, else os.UserCacheDir()/parley.
	CacheDir string
	// Endpoint is the base URL of the hub. Default: $PARLEY_HF_ENDPOINT, else DefaultEndpoint.
	Endpoint string
	// Token is sent as "Authorization: Bearer <Token>". Default: $HF_TOKEN.
	Token string
	// Progress receives a single-line progress bar redrawn with \r; nil disables it.
	Progress io.Writer
	// Client performs the requests. Default: http.DefaultClient. Its CheckRedirect, if any,
	// is still consulted.
	Client *http.Client
}

// IsRemote reports whether name should be passed to Resolve rather than opened as a path.
func IsRemote(name string) bool {
	return strings.HasPrefix(name, Scheme)
}

// CheckName reports, without a request, whether name is a well-formed hf:// name: an error
// wrapping ErrBadName that says what is wrong when it is not.
func CheckName(name string) error {
	_, err := parse(name)
	return err
}

// ref is a parsed remote name.
type ref struct {
	owner, repo, revision string
	path                  string // slash-separated, relative, validated
}

func (r ref) String() string {
	return Scheme + r.owner + "/" + r.repo + "@" + r.revision + "/" + r.path
}

var (
	// Hugging Face user, organisation and repository names.
	idRE = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$`)
	// Branch, tag or commit names without "/".
	revRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,255}$`)
	// One component of a file path inside a repository.
	segRE = regexp.MustCompile(`^[A-Za-z0-9._+-][A-Za-z0-9 ._+=,()\[\]-]{0,254}$`)
)

func badName(name, format string, args ...any) error {
	return fmt.Errorf("%w %q: %s", ErrBadName, name, fmt.Sprintf(format, args...))
}

// parse validates name strictly: owner and repo follow the hub's naming rules, the revision and
// every path component are plain names, and nothing can escape the cache directory.
func parse(name string) (ref, error) {
	if !IsRemote(name) {
		return ref{}, badName(name, "does not start with %s", Scheme)
	}
	rest := name[len(Scheme):]
	if strings.ContainsAny(rest, "\\?#%") {
		return ref{}, badName(name, `contains one of \ ? # %%`)
	}
	parts := strings.Split(rest, "/")
	if len(parts) < 3 {
		return ref{}, badName(name, "want %sowner/repo[@revision]/path/to/file", Scheme)
	}
	r := ref{owner: parts[0], repo: parts[1], revision: "main"}
	if i := strings.IndexByte(r.repo, '@'); i >= 0 {
		r.repo, r.revision = r.repo[:i], r.repo[i+1:]
		if !revRE.MatchString(r.revision) || strings.Contains(r.revision, "..") || r.revision == "." {
			return ref{}, badName(name, "invalid revision %q", r.revision)
		}
	}
	for _, id := range []struct{ what, v string }{{"owner", r.owner}, {"repo", r.repo}} {
		if !idRE.MatchString(id.v) || strings.Contains(id.v, "..") || strings.Contains(id.v, "--") {
			return ref{}, badName(name, "invalid %s %q", id.what, id.v)
		}
	}
	for _, seg := range parts[2:] {
		switch {
		case seg == "":
			return ref{}, badName(name, "empty path component")
		case seg == "." || seg == "..":
			return ref{}, badName(name, "path component %q not allowed", seg)
		case !segRE.MatchString(seg):
			return ref{}, badName(name, "invalid path component %q", seg)
		case strings.HasSuffix(seg, ".partial") || strings.HasSuffix(seg, ".lock"):
			return ref{}, badName(name, "path component %q uses a reserved suffix", seg)
		}
	}
	r.path = strings.Join(parts[2:], "/")
	return r, nil
}

// resolved holds Options with every default applied.
type resolved struct {
	cacheDir, endpoint, token string
	progress                  io.Writer
	client                    *http.Client
}

func (o Options) withDefaults() (resolved, error) {
	r := resolved{cacheDir: o.CacheDir, endpoint: o.Endpoint, token: o.Token, progress: o.Progress, client: o.Client}
	if r.cacheDir == "" {
		r.cacheDir = os.Getenv("PARLEY_CACHE")
	}
	if r.cacheDir == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			return r, fmt.Errorf("hub: no cache directory (set PARLEY_CACHE): %w", err)
		}
		r.cacheDir = filepath.Join(d, "parley")
	}
	if r.endpoint == "" {
		r.endpoint = os.Getenv("PARLEY_HF_ENDPOINT")
	}
	if r.endpoint == "" {
		r.endpoint = DefaultEndpoint
	}
	r.endpoint = strings.TrimRight(r.endpoint, "/")
	if !strings.HasPrefix(r.endpoint, "http://") && !strings.HasPrefix(r.endpoint, "https://") {
		return r, fmt.Errorf("hub: endpoint %q is not an http(s) URL", r.endpoint)
	}
	if r.token == "" {
		r.token = os.Getenv("HF_TOKEN")
	}
	if r.client == nil {
		r.client = http.DefaultClient
	}
	return r, nil
}

// localPath returns the cache path of r: {cacheDir}/hf/{owner}/{repo}/{revision}/{path}.
func localPath(cacheDir string, r ref) string {
	return filepath.Join(cacheDir, "hf", r.owner, r.repo, r.revision, filepath.FromSlash(r.path))
}

// Resolve returns the local path of the remote file name (see IsRemote), downloading it into the
// cache first unless a complete copy is already there. It blocks while another process or
// goroutine downloads the same file, then uses that copy. Cancelling ctx stops the download and
// leaves a partial file that the next call resumes.
func Resolve(ctx context.Context, name string, o Options) (string, error) {
	r, err := parse(name)
	if err != nil {
		return "", err
	}
	opt, err := o.withDefaults()
	if err != nil {
		return "", err
	}
	final := localPath(opt.cacheDir, r)
	if ok, err := complete(final); err != nil || ok {
		return final, err
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return "", fmt.Errorf("hub: %s: %w", name, err)
	}
	unlock, err := lockPath(ctx, final+".lock")
	if err != nil {
		return "", fmt.Errorf("hub: %s: waiting for lock: %w", name, err)
	}
	defer unlock()
	// Another holder of the lock may have finished the download meanwhile.
	if ok, err := complete(final); err != nil || ok {
		return final, err
	}
	if err := download(ctx, opt, r, final); err != nil {
		return "", err
	}
	return final, nil
}

// complete reports whether final exists as a regular file.
func complete(final string) (bool, error) {
	fi, err := os.Stat(final)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("hub: %w", err)
	case !fi.Mode().IsRegular():
		return false, fmt.Errorf("hub: %s exists and is not a regular file", final)
	}
	return true, nil
}
