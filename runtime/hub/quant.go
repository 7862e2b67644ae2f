package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// splitRE matches the name of one file of a split GGUF model as llama.cpp's gguf-split writes
// it: PREFIX-00001-of-00003.gguf.
var splitRE = regexp.MustCompile(`^(.*)-([0-9]{5})-of-([0-9]{5})\.gguf$`)

// splitShards returns the paths of every file of the split model that p is one file of, the
// first file first; nil when p is not such a file.
func splitShards(p string) []string {
	m := splitRE.FindStringSubmatch(p)
	if m == nil {
		return nil
	}
	i, _ := strconv.Atoi(m[2])
	n, _ := strconv.Atoi(m[3])
	if n < 1 || i < 1 || i > n {
		return nil
	}
	out := make([]string, n)
	for k := range out {
		out[k] = fmt.Sprintf("%s-%05d-of-%05d.gguf", m[1], k+1, n)
	}
	return out
}

// model is one GGUF model of a repository: one file, or the files of a split model.
type model struct {
	key   string   // the path, a split model's without its -0000i-of-0000N
	files []string // sorted; a split model's first file first
}

// ggufModels groups the GGUF files among paths into models. Multimodal projectors (mmproj) are
// not models of their own, as llama.cpp does not take them for one.
func ggufModels(paths []string) []model {
	byKey := map[string]*model{}
	var keys []string
	for _, p := range paths {
		base := strings.ToLower(path.Base(p))
		if !strings.HasSuffix(base, ".gguf") || strings.Contains(base, "mmproj") {
			continue
		}
		key := p
		if m := splitRE.FindStringSubmatch(p); m != nil {
			key = m[1] + ".gguf"
		}
		if byKey[key] == nil {
			byKey[key] = &model{key: key}
			keys = append(keys, key)
		}
		byKey[key].files = append(byKey[key].files, p)
	}
	slices.Sort(keys)
	out := make([]model, 0, len(keys))
	for _, k := range keys {
		m := byKey[k]
		slices.Sort(m.files)
		out = append(out, *m)
	}
	return out
}

// matchesTag reports whether the model named key (a path ending in .gguf) carries the
// quantisation tag, case-insensitively, as a whole part of its name: after the start, '/', '-',
// '.' or '_', and before the end, '/', '-' or '.'. So Q4_K matches model-Q4_K.gguf and
// Q4_K/model.gguf but not model-Q4_K_M.gguf, and Q4_XS not model-IQ4_XS.gguf.
func matchesTag(key, tag string) bool {
	s := strings.ToLower(strings.TrimSuffix(key, path.Ext(key)))
	tag = strings.ToLower(tag)
	for i := 0; ; {
		j := strings.Index(s[i:], tag)
		if j < 0 {
			return false
		}
		at, end := i+j, i+j+len(tag)
		before := at == 0 || strings.IndexByte("/-._", s[at-1]) >= 0
		after := end == len(s) || strings.IndexByte("/-.", s[end]) >= 0
		if before && after {
			return true
		}
		i = at + 1
	}
}

// pick returns r with its path set to the file of the model the repository's file list holds
// for r's quantisation tag (a split model's first file). When the list cannot be fetched (no
// network), the files already in the cache are searched instead.
func pick(ctx context.Context, o resolved, r ref) (ref, error) {
	files, err := listFiles(ctx, o, r)
	source := "the repository"
	if err != nil && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrNotFound) && ctx.Err() == nil {
		local, lerr := cachedFiles(o.cacheDir, r)
		if lerr != nil || len(local) == 0 {
			return r, err
		}
		files, source = local, "the cache (the file list could not be fetched: "+err.Error()+")"
	} else if err != nil {
		return r, err
	}
	all := ggufModels(files)
	var hits []model
	for _, m := range all {
		if matchesTag(m.key, r.tag) {
			hits = append(hits, m)
		}
	}
	switch {
	case len(hits) == 1:
		m := hits[0]
		if len(m.files) > 1 || splitShards(m.files[0]) != nil {
			if want := splitShards(m.files[0]); len(want) != len(m.files) || !slices.Equal(want, m.files) {
				return r, fmt.Errorf("%w: %s: the split model %s lacks files: %s has %s", ErrNotFound, r, m.key, source, strings.Join(m.files, ", "))
			}
		}
		// The list is the server's: its names are held to the rules of a name given by hand.
		for _, f := range m.files {
			if _, err := parse(Scheme + r.owner + "/" + r.repo + "/" + f); err != nil {
				return r, fmt.Errorf("hub: %s: %s lists a file under a name not taken: %w", r, source, err)
			}
		}
		r.path = m.files[0]
		return r, nil
	case len(hits) > 1:
		return r, fmt.Errorf("%w: %s: %d models in %s match %q: %s; name one as %s%s/%s/FILE",
			ErrAmbiguous, r, len(hits), source, r.tag, keysOf(hits), Scheme, r.owner, r.repo)
	case len(all) == 0:
		return r, fmt.Errorf("%w: %s: %s has no GGUF file", ErrNotFound, r, source)
	}
	return r, fmt.Errorf("%w: %s: no GGUF file in %s matches %q; it has %s", ErrNotFound, r, source, r.tag, keysOf(all))
}

func keysOf(ms []model) string {
	var b strings.Builder
	for i, m := range ms {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(m.key)
		if len(m.files) > 1 {
			fmt.Fprintf(&b, " (%d files)", len(m.files))
		}
	}
	return b.String()
}

// treeURL returns the first page of the hub's recursive file list of r's revision:
// {endpoint}/api/models/{owner}/{repo}/tree/{revision}?recursive=true.
func treeURL(endpoint string, r ref) string {
	return endpoint + "/api/models/" + r.owner + "/" + r.repo + "/tree/" + url.PathEscape(r.revision) + "?recursive=true"
}

// maxPages bounds the pages of a file list followed through Link headers.
const maxPages = 100

// listFiles returns the paths of every file of r's revision, following the list's pages (the
// hub's Link: <URL>; rel="next").
func listFiles(ctx context.Context, o resolved, r ref) ([]string, error) {
	var files []string
	u := treeURL(o.endpoint, r)
	for page := 0; u != ""; page++ {
		if page == maxPages {
			return nil, fmt.Errorf("hub: %s: the file list has more than %d pages", r, maxPages)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, fmt.Errorf("hub: %s: %w", r, err)
		}
		if o.token != "" {
			req.Header.Set("Authorization", "Bearer "+o.token)
		}
		req.Header.Set("User-Agent", "parley")
		resp, err := o.client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("hub: %s: %w", r, ctx.Err())
			}
			return nil, fmt.Errorf("hub: %s: request %s: %w", r, u, err)
		}
		var entries []struct {
			Type string `json:"type"`
			Path string `json:"path"`
		}
		switch resp.StatusCode {
		case http.StatusOK:
			err = json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&entries)
		case http.StatusUnauthorized, http.StatusForbidden:
			err = fmt.Errorf("%w: %s: %s: listing the repository needs a token with access (HF_TOKEN)", ErrAuth, r, resp.Status)
		case http.StatusNotFound:
			err = fmt.Errorf("%w: %s: no such repository or revision (%s)", ErrNotFound, r, u)
		default:
			err = fmt.Errorf("hub: %s: unexpected response %s from %s", r, resp.Status, u)
		}
		next := nextLink(resp.Header.Values("Link"), resp.Request.URL)
		resp.Body.Close()
		if err != nil {
			if resp.StatusCode == http.StatusOK {
				err = fmt.Errorf("hub: %s: file list from %s: %w", r, u, err)
			}
			return nil, err
		}
		for _, e := range entries {
			if e.Type == "file" {
				files = append(files, e.Path)
			}
		}
		u = next
	}
	return files, nil
}

// nextLink returns the URL of the rel="next" link among Link header values, resolved against
// base; "" when there is none.
func nextLink(values []string, base *url.URL) string {
	for _, v := range values {
		for _, l := range strings.Split(v, ",") {
			target, params, ok := strings.Cut(strings.TrimSpace(l), ";")
			if !ok || !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
				continue
			}
			for _, p := range strings.Split(params, ";") {
				if k, v, _ := strings.Cut(strings.TrimSpace(p), "="); k == "rel" && strings.Trim(v, `"`) == "next" {
					u, err := base.Parse(target[1 : len(target)-1])
					if err != nil {
						return ""
					}
					return u.String()
				}
			}
		}
	}
	return ""
}

// cachedFiles returns the complete files under r's revision in the cache, as repository paths.
func cachedFiles(cacheDir string, r ref) ([]string, error) {
	root := filepath.Join(cacheDir, "hf", r.owner, r.repo, r.revision)
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() || strings.HasSuffix(p, ".partial") || strings.HasSuffix(p, ".lock") {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return files, err
}
