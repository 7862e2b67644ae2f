package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// TestTranscribeMatchesWhisperCpp transcribes recordings through the binary with whisper-cli's
// settings (-l en -nt -nf, greedy) and compares the token ids and probabilities of --json with
// whisper.cpp's (flash attention off) for the random-weight tiny.en model the references were
// made with. Ids must be equal (the library's parity test shows the reference's margins are above
// rounding on these files); plog within 2e-2 (logits within 1e-2).
func TestTranscribeMatchesWhisperCpp(t *testing.T) {
	model := sharedtest.WhisperRandomModel(t, "tiny.en")
	ref := sharedtest.Path(t, "reference/asr/decode/tiny.en-f16/greedy-nfa")
	for _, be := range backends() {
		t.Run(be, func(t *testing.T) {
			wavs := []string{"jfk", "psx-cards-001"}
			args := []string{"transcribe", "--backend", be, "-m", model, "--language", "en", "--no-timestamps", "--no-fallback", "--json"}
			for _, u := range wavs {
				args = append(args, sharedtest.Path(t, "data/asr/wav/"+u+".wav"))
			}
			res := parley(t, "", args...)
			if res.code != 0 {
				t.Fatalf("exit %d: %s", res.code, res.stderr)
			}
			dec := json.NewDecoder(strings.NewReader(res.stdout))
			for _, u := range wavs {
				var got struct {
					Text   string
					Tokens []struct {
						ID    int32
						P     float32
						PLog  float32
						Frame *int // a transducer's only
					}
				}
				if err := dec.Decode(&got); err != nil {
					t.Fatalf("%s: %v in %q", u, err, res.stdout)
				}
				b, err := os.ReadFile(filepath.Join(ref, u+".tokens.json"))
				if err != nil {
					t.Fatal(err)
				}
				var want struct {
					Text   string `json:"text"`
					Tokens []struct {
						ID   int32   `json:"id"`
						PLog float32 `json:"plog"`
					} `json:"tokens"`
				}
				if err := json.Unmarshal(b, &want); err != nil {
					t.Fatal(err)
				}
				if len(got.Tokens) != len(want.Tokens) {
					t.Fatalf("%s: %d tokens, whisper.cpp %d", u, len(got.Tokens), len(want.Tokens))
				}
				for i := range want.Tokens {
					if got.Tokens[i].ID != want.Tokens[i].ID || got.Tokens[i].Frame != nil {
						t.Fatalf("%s: token %d is %d (frame %v), whisper.cpp %d", u, i, got.Tokens[i].ID, got.Tokens[i].Frame, want.Tokens[i].ID)
					}
					if d := got.Tokens[i].PLog - want.Tokens[i].PLog; d > 2e-2 || d < -2e-2 {
						t.Fatalf("%s: token %d plog %.5f, whisper.cpp %.5f", u, i, got.Tokens[i].PLog, want.Tokens[i].PLog)
					}
				}
				if got.Text != want.Text {
					t.Errorf("%s: text %q, whisper.cpp %q", u, got.Text, want.Text)
				}
			}
		})
	}
}

// TestTranscribeFormatsAndBadInput: subtitle formats are well formed, and bad input gets a clear
// error and exit status.
func TestTranscribeFormatsAndBadInput(t *testing.T) {
	model := sharedtest.WhisperRandomModel(t, "tiny.en")
	wav := sharedtest.Path(t, "data/asr/wav/psx-cards-001.wav")
	for _, f := range []struct{ format, want string }{
		{"srt", `^1\n\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}\n`},
		{"vtt", `^WEBVTT\n\n\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}\n`},
	} {
		res := parley(t, "", "transcribe", "-m", model, "--language", "en", "--no-fallback", "--output-format", f.format, wav)
		if res.code != 0 || !regexp.MustCompile(f.want).MatchString(res.stdout) {
			t.Errorf("--output-format %s: exit %d, output %q, stderr %s", f.format, res.code, res.stdout, res.stderr)
		}
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, err := os.ReadFile(wav)
	if err != nil {
		t.Fatal(err)
	}
	truncatedWAV := write("cut.wav", good[:30])
	notAudio := write("notes.txt", []byte("this is not audio"))
	ggufModel := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	vocabOnly := sharedtest.Path(t, "models/asr/for-tests-ggml-tiny.en.bin")
	for _, c := range []struct {
		name  string
		args  []string
		code  int
		match string
	}{
		{"no file", []string{"transcribe", "-m", model}, 2, "no audio file"},
		{"no model", []string{"transcribe", wav}, 2, "-m MODEL"},
		{"bad format", []string{"transcribe", "-m", model, "--output-format", "docx", wav}, 2, "docx"},
		{"bad beam", []string{"transcribe", "-m", model, "--beam", "99", wav}, 2, "beam"},
		{"truncated wav", []string{"transcribe", "-m", model, truncatedWAV}, 1, "audio"},
		{"not audio", []string{"transcribe", "-m", model, notAudio}, 1, "unsupported"},
		{"language model gguf", []string{"transcribe", "-m", ggufModel, wav}, 1, `architecture is "llama", not "whisper"`},
		{"model neither ggml nor gguf", []string{"transcribe", "-m", notAudio, wav}, 1, "neither whisper.cpp's ggml format nor GGUF"},
		{"vocabulary-only model", []string{"transcribe", "-m", vocabOnly, wav}, 1, "no weights"},
		{"language on English model", []string{"transcribe", "-m", model, "--language", "de", wav}, 2, "english-only"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := parley(t, "", c.args...)
			if res.code != c.code {
				t.Errorf("exit %d, want %d; stderr: %s", res.code, c.code, res.stderr)
			}
			if !strings.Contains(strings.ToLower(res.stderr), strings.ToLower(c.match)) {
				t.Errorf("stderr %q does not mention %q", res.stderr, c.match)
			}
		})
	}
}

// TestTranscribeSeveralFiles: with several FILEs, a file that fails is reported and the others
// are still transcribed (exit 1 at the end); text output names each file head(1)'s way, --json
// is JSON Lines with a "file" member, srt and vtt need --output-dir, which writes one file a FILE
// and never over an input. One FILE prints as it always has, its JSON times to the millisecond.
func TestTranscribeSeveralFiles(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.WhisperRandomModel(t, "tiny.en")
	dir := t.TempDir()
	cp := func(src, dst string) string {
		b, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/"+src+".wav"))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, dst)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b := cp("psx-cards-001", "a.wav"), cp("ljs-LJ001-0001", "b.flac.wav")
	missing := filepath.Join(dir, "missing.wav")
	// A named backend, so that stderr holds only what this test looks for (auto notes the
	// backends it skips: cpu in a nocgo build, cuda without a GPU).
	be := "cpu"
	if buildTags == "nocgo" {
		be = "go"
	}
	run := func(args ...string) result {
		t.Helper()
		return parley(t, "", append([]string{"transcribe", "-m", model, "--backend", be, "--language", "en", "--no-fallback"}, args...)...)
	}
	one := map[string]map[string]string{} // file, format: the output of transcribing it alone
	for _, f := range []string{a, b} {
		one[f] = map[string]string{}
		for _, format := range []string{"txt", "srt", "json"} {
			res := run("--output-format", format, f)
			if res.code != 0 || res.stdout == "" || res.stderr != "" {
				t.Fatalf("%s alone as %s: exit %d, %q, stderr %s", f, format, res.code, res.stdout, res.stderr)
			}
			one[f][format] = res.stdout
		}
		js := one[f]["json"]
		if strings.Contains(js, `"file"`) || strings.Count(js, "\n") != 1 {
			t.Errorf("%s alone as json: %s", f, js)
		}
		// Times in whole milliseconds (interpolated token times are not, unrounded).
		if m := regexp.MustCompile(`"(start|end|t0|t1)":-?\d+\.\d{4,}`).FindString(js); m != "" {
			t.Errorf("%s as json: %s is not to the millisecond", f, m)
		}
	}
	if !strings.HasPrefix(one[b]["srt"], "1\n") || strings.Count(one[b]["srt"], " --> ") < 2 {
		t.Fatalf("the test wants a file of several segments: %q", one[b]["srt"])
	}

	t.Run("text", func(t *testing.T) {
		res := run(a, missing, b)
		want := "==> " + a + " <==\n" + one[a]["txt"] + "\n==> " + b + " <==\n" + one[b]["txt"]
		if res.code != 1 || res.stdout != want {
			t.Errorf("exit %d, output %q; want 1, %q", res.code, res.stdout, want)
		}
		if !strings.Contains(res.stderr, "parley transcribe: "+missing+": no such file") || strings.Count(res.stderr, "\n") != 2 {
			t.Errorf("stderr %q: want the missing file, and a summary", res.stderr)
		}
	})
	t.Run("json lines", func(t *testing.T) {
		res := run("--json", a, b)
		lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
		if res.code != 0 || len(lines) != 2 {
			t.Fatalf("exit %d, %d lines: %s %s", res.code, len(lines), res.stdout, res.stderr)
		}
		for i, f := range []string{a, b} {
			var got, alone map[string]any
			if err := json.Unmarshal([]byte(lines[i]), &got); err != nil {
				t.Fatalf("line %d: %v", i+1, err)
			}
			json.Unmarshal([]byte(one[f]["json"]), &alone)
			if got["file"] != f || got["text"] != alone["text"] || len(got) != len(alone)+1 {
				t.Errorf("line %d: file %v, text %v; want %s, %v", i+1, got["file"], got["text"], f, alone["text"])
			}
		}
	})
	t.Run("subtitles need --output-dir", func(t *testing.T) {
		for _, format := range []string{"srt", "vtt"} {
			if res := run("--output-format", format, a, b); res.code != 2 || res.stdout != "" || !strings.Contains(res.stderr, "--output-dir") {
				t.Errorf("%s: exit %d, stdout %q, stderr %q; want 2 and a word on --output-dir", format, res.code, res.stdout, res.stderr)
			}
		}
	})
	t.Run("output-dir", func(t *testing.T) {
		out := filepath.Join(dir, "out", "sub") // made as needed
		res := run("--output-format", "srt", "--output-dir", out, a, missing, b)
		if res.code != 1 || res.stdout != "" || !strings.Contains(res.stderr, missing) {
			t.Errorf("exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
		}
		for name, want := range map[string]string{"a.srt": one[a]["srt"], "b.flac.srt": one[b]["srt"]} {
			if got, err := os.ReadFile(filepath.Join(out, name)); err != nil || string(got) != want {
				t.Errorf("%s: %q (%v), want %q", name, got, err, want)
			}
		}
		if _, err := os.Stat(filepath.Join(out, "missing.srt")); err == nil {
			t.Error("an output for the missing file")
		}
		if res := run("--json", "--output-dir", out, a); res.code != 0 {
			t.Errorf("--json: exit %d %s", res.code, res.stderr)
		} else if got, _ := os.ReadFile(filepath.Join(out, "a.json")); string(got) != one[a]["json"] {
			t.Errorf("a.json %q, want %q", got, one[a]["json"])
		}
	})
	t.Run("output-dir refuses", func(t *testing.T) {
		clip := cp("psx-cards-001", "clips/clip.txt") // audio under a name the text output would take
		before, _ := os.ReadFile(clip)
		res := run("--output-dir", filepath.Dir(clip), a, clip)
		after, _ := os.ReadFile(clip)
		if res.code != 2 || !strings.Contains(res.stderr, "overwrite") || string(after) != string(before) {
			t.Errorf("output onto an input: exit %d, stderr %q", res.code, res.stderr)
		}
		twin := cp("psx-cards-001", "other/a.wav")
		if res := run("--output-dir", filepath.Join(dir, "twins"), a, twin); res.code != 2 || !strings.Contains(res.stderr, "both") {
			t.Errorf("two inputs of one name: exit %d, stderr %q", res.code, res.stderr)
		}
	})
	t.Run("help", func(t *testing.T) {
		res := parley(t, "", "transcribe", "-h")
		if res.code != 0 || !strings.Contains(res.stderr, "-output-dir DIR") || !strings.Contains(res.stderr, `"==> FILE <=="`) {
			t.Errorf("exit %d, help %s", res.code, res.stderr)
		}
	})
}

// TestConvertToGGUF: `parley convert` writes the whisper.cpp model as GGUF, `parley inspect`
// reads it, and transcribing with the GGUF file prints exactly what the ggml file gives.
func TestConvertToGGUF(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.WhisperRandomModel(t, "tiny.en")
	out := filepath.Join(t.TempDir(), "tiny.en.gguf")
	if res := parley(t, "", "convert", "-o", out, model); res.code != 0 {
		t.Fatalf("convert: exit %d: %s", res.code, res.stderr)
	}
	res := parley(t, "", "inspect", "--json", out)
	if res.code != 0 {
		t.Fatalf("inspect: exit %d: %s", res.code, res.stderr)
	}
	var info struct {
		Metadata map[string]any
		Tensors  []struct{ Name string }
	}
	if err := json.Unmarshal([]byte(res.stdout), &info); err != nil {
		t.Fatal(err)
	}
	if info.Metadata["general.architecture"] != "whisper" || info.Metadata["whisper.decoder.block_count"] != float64(4) || len(info.Tensors) < 100 {
		t.Errorf("inspect: architecture %v, decoder blocks %v, %d tensors", info.Metadata["general.architecture"], info.Metadata["whisper.decoder.block_count"], len(info.Tensors))
	}
	// The ggml file itself: its header and the same tensors but the filter bank.
	res = parley(t, "", "inspect", "--json", model)
	if res.code != 0 {
		t.Fatalf("inspect the ggml file: exit %d: %s", res.code, res.stderr)
	}
	var ginfo struct {
		Format    string
		HParams   map[string]int
		VocabSize int `json:"vocab_size"`
		Tensors   []struct{ Name string }
	}
	if err := json.Unmarshal([]byte(res.stdout), &ginfo); err != nil {
		t.Fatal(err)
	}
	if ginfo.Format != "ggml" || ginfo.HParams["n_text_layer"] != 4 || ginfo.VocabSize != 50257 || len(ginfo.Tensors) != len(info.Tensors)-1 {
		t.Errorf("inspect the ggml file: %+v (%d tensors; the GGUF has %d)", ginfo.HParams, len(ginfo.Tensors), len(info.Tensors))
	}
	wav := sharedtest.Path(t, "data/asr/wav/jfk.wav")
	var outs []string
	for _, m := range []string{model, out} {
		res := parley(t, "", "transcribe", "-m", m, "--language", "en", "--no-fallback", "--json", wav)
		if res.code != 0 {
			t.Fatalf("transcribe %s: exit %d: %s", filepath.Base(m), res.code, res.stderr)
		}
		outs = append(outs, res.stdout)
	}
	if outs[0] != outs[1] || !strings.Contains(outs[0], `"tokens"`) {
		t.Errorf("the GGUF file transcribes differently:\nggml: %.300s\ngguf: %.300s", outs[0], outs[1])
	}
	// Converting a file onto itself replaces it with the GGUF, whose text is the same (writing
	// in place would truncate the mapped input while its tensors are read).
	inPlace := filepath.Join(t.TempDir(), "in-place.bin")
	data, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inPlace, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if res := parley(t, "", "convert", "-o", inPlace, inPlace); res.code != 0 {
		t.Fatalf("convert in place: exit %d: %s", res.code, res.stderr)
	}
	if res := parley(t, "", "transcribe", "-m", inPlace, "--language", "en", "--no-fallback", "--json", wav); res.code != 0 || res.stdout != outs[1] {
		t.Errorf("converted in place: exit %d: %.300s %s", res.code, res.stdout, res.stderr)
	}
	// Quantised, in either format: smaller, and it transcribes.
	for _, format := range []string{"ggml", "gguf"} {
		q := filepath.Join(t.TempDir(), "tiny.en-q5_1."+format)
		if res := parley(t, "", "convert", "--type", "q5_1", "--format", format, "-o", q, model); res.code != 0 {
			t.Fatalf("convert --type q5_1 --format %s: exit %d: %s", format, res.code, res.stderr)
		}
		st, err := os.Stat(q)
		if err != nil {
			t.Fatal(err)
		}
		src, err := os.Stat(model)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > src.Size()/2 {
			t.Errorf("%s: %d bytes from %d", q, st.Size(), src.Size())
		}
		if res := parley(t, "", "transcribe", "-m", q, "--language", "en", "--json", wav); res.code != 0 || !strings.Contains(res.stdout, `"tokens"`) {
			t.Errorf("transcribe with %s: exit %d: %s", filepath.Base(q), res.code, res.stderr)
		}
	}
	if res := parley(t, "", "convert", "--type", "q4_k", "-o", filepath.Join(t.TempDir(), "x.gguf"), model); res.code == 0 || !strings.Contains(res.stderr, "Q4_K") {
		t.Errorf("convert --type q4_k: exit %d: %s", res.code, res.stderr)
	}
	if res := parley(t, "", "convert", "-o", filepath.Join(t.TempDir(), "x.gguf"), wav); res.code == 0 || !strings.Contains(res.stderr, "ggml") {
		t.Errorf("converting a WAV file: exit %d: %s", res.code, res.stderr)
	}
}

// TestBenchWhisper: `parley bench` measures a Whisper model (encoder, decoder steps alone and
// batched, real-time factor over a file) and reports it as JSON; a decode step allocates nothing.
func TestBenchWhisper(t *testing.T) {
	model := sharedtest.WhisperRandomModel(t, "tiny.en")
	wav := sharedtest.Path(t, "data/asr/wav/psx-cards-001.wav")
	res := parley(t, "", "bench", "-m", model, "-r", "1", "-n", "32", "--parallel", "2", "--audio", wav, "--json")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	var got struct {
		EncodeMS float64 `json:"encode_ms_per_window"`
		TG       float64 `json:"tg_tokens_per_s"`
		Allocs   float64 `json:"allocs_per_decode_step"`
		Parallel []struct {
			Seqs int
			TG   float64 `json:"tg_tokens_per_s"`
		}
		AudioSeconds float64 `json:"audio_seconds"`
		RTF          float64 `json:"rtf"`
		HParams      struct {
			TextLayer int `json:"n_text_layer"`
		}
	}
	if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
		t.Fatalf("%v: %s", err, res.stdout)
	}
	if got.EncodeMS <= 0 || got.TG <= 0 || len(got.Parallel) != 1 || got.Parallel[0].Seqs != 2 || got.Parallel[0].TG <= 0 ||
		got.AudioSeconds < 1 || got.RTF <= 0 || got.HParams.TextLayer != 4 {
		t.Errorf("bench: %s", res.stdout)
	}
	if got.Allocs >= 1 { // a stray runtime allocation in the timed loop is not the step's
		t.Errorf("a decoder step allocated %.1f times", got.Allocs)
	}
	if res := parley(t, "", "bench", "-m", sharedtest.Path(t, "models/llm/stories260K-f32.gguf"), "--audio", wav); res.code != 2 {
		t.Errorf("--audio with a language model: exit %d: %s", res.code, res.stderr)
	}
	for _, flag := range [][]string{{"-p", "32"}, {"--kv-type", "f32"}} {
		if res := parley(t, "", "bench", "-m", model, flag[0], flag[1]); res.code != 2 || !strings.Contains(res.stderr, "language models only") {
			t.Errorf("%s with a Whisper model: exit %d: %s", flag[0], res.code, res.stderr)
		}
	}
}

// TestCommandsDownloadHFModel: every command that takes a model takes hf://owner/repo/file too,
// downloading it once into the cache (from a local stand-in for the hub).
func TestCommandsDownloadHFModel(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.WhisperRandomModel(t, "tiny.en")
	data, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	hubSrv, hits := fakeHub(t, "/ggerganov/whisper.cpp/resolve/main/ggml-tiny.en.bin", data)
	t.Setenv("PARLEY_HF_ENDPOINT", hubSrv.URL)
	t.Setenv("PARLEY_CACHE", t.TempDir())
	const remote = "hf://ggerganov/whisper.cpp/ggml-tiny.en.bin"
	wav := sharedtest.Path(t, "data/asr/wav/psx-cards-001.wav")
	want := parley(t, "", "transcribe", "-m", model, wav)
	got := parley(t, "", "transcribe", "-m", remote, wav)
	if got.code != 0 || got.stdout != want.stdout {
		t.Fatalf("transcribe -m %s: exit %d, %q (local file: %q)\n%s", remote, got.code, got.stdout, want.stdout, got.stderr)
	}
	if res := parley(t, "", "inspect", "--json", remote); res.code != 0 || !strings.Contains(res.stdout, `"ggml"`) {
		t.Errorf("inspect %s: exit %d: %s", remote, res.code, res.stderr)
	}
	if hits.Load() != 1 {
		t.Errorf("the hub was asked %d times for the file; want once (then the cache)", hits.Load())
	}
}
