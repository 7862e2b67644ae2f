package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// procKB reads a "Name: N kB" line of /proc/pid/status, in bytes.
func procKB(t *testing.T, pid int, name string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", name, line)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, name)
	return 0
}

// procCPU is the CPU time pid has used (user and system), from /proc/pid/stat.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	// The fields after the command's closing parenthesis; utime and stime are the 14th and 15th
	// of the line, in clock ticks of 1/100 s (USER_HZ, which Linux exports as 100).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// metric is the value of the sample of base's /metrics whose name and labels are series
// (`parley_steps_total{model="whisper"}`), or 0 where there is none.
func metric(t *testing.T, base, series string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %q", series, sc.Text())
			}
			return n
		}
	}
	return 0
}

// speechSteps is the speech model whisper's step count from /metrics.
func speechSteps(t *testing.T, base string) int {
	return int(metric(t, base, `parley_steps_total{model="whisper"}`))
}

// postAudio posts file to base's /v1/audio/transcriptions under ctx and reports the outcome.
func postAudio(ctx context.Context, base string, file []byte, fileType string) error {
	code, body, err := postAudioStatus(ctx, base, file, fileType)
	if err != nil {
		return err
	}
	return fmt.Errorf("status %d: %s", code, body)
}

// postAudioStatus posts file, of type fileType, to base's /v1/audio/transcriptions under ctx and
// returns the status and body.
func postAudioStatus(ctx context.Context, base string, file []byte, fileType string) (int, string, error) {
	code, body, _, err := postAudioTimed(ctx, base, file, fileType)
	return code, body, err
}

// postAudioTimed is postAudioStatus that also returns the time from the request's last byte
// being sent to the response's first byte.
func postAudioTimed(ctx context.Context, base string, file []byte, fileType string) (int, string, time.Duration, error) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	mw.WriteField("model", "whisper")
	h := map[string][]string{"Content-Disposition": {`form-data; name="file"; filename="a"`}, "Content-Type": {fileType}}
	w, _ := mw.CreatePart(h)
	w.Write(file)
	mw.Close()
	// The transport's goroutines set these, the request's writer possibly after Do returns (an
	// answer before the body was all sent).
	var mu sync.Mutex
	var began, sent, answered time.Time
	mark := func(t *time.Time) {
		mu.Lock()
		*t = time.Now()
		mu.Unlock()
	}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders:         func() { mark(&began) },
		WroteRequest:         func(httptrace.WroteRequestInfo) { mark(&sent) },
		GotFirstResponseByte: func() { mark(&answered) },
	})
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/audio/transcriptions", &b)
	if err != nil {
		return 0, "", 0, err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", 0, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if sent.IsZero() || answered.Before(sent) {
		// Answered before the body was all sent: from the request's arrival.
		return resp.StatusCode, string(body), answered.Sub(began), nil
	}
	return resp.StatusCode, string(body), answered.Sub(sent), nil
}

// lowRateWAV is sec seconds of 8-bit mono PCM at 1 kHz, a low-level ripple: a small upload
// (1 kB a second) that decodes to 16 times as many samples.
func lowRateWAV(sec int) []byte {
	n := 1000 * sec
	b := make([]byte, 0, 44+n)
	b = append(b, "RIFF"...)
	b = binary.LittleEndian.AppendUint32(b, uint32(36+n))
	b = append(b, "WAVEfmt "...)
	b = binary.LittleEndian.AppendUint32(b, 16)
	b = binary.LittleEndian.AppendUint16(b, 1)    // PCM
	b = binary.LittleEndian.AppendUint16(b, 1)    // mono
	b = binary.LittleEndian.AppendUint32(b, 1000) // rate
	b = binary.LittleEndian.AppendUint32(b, 1000) // bytes a second
	b = binary.LittleEndian.AppendUint16(b, 1)    // block align
	b = binary.LittleEndian.AppendUint16(b, 8)    // bits
	b = append(b, "data"...)
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	for i := range n {
		b = append(b, byte(128+(i*7)%5))
	}
	return b
}

// waitIdle waits, after a client has left, for the server to stop using the CPU: it returns how
// long until a 200 ms stretch in which the process used at most 10 ms of CPU, or fails t after
// limit.
func waitIdle(t *testing.T, pid int, limit time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	for c := procCPU(t, pid); ; {
		time.Sleep(200 * time.Millisecond)
		c2 := procCPU(t, pid)
		if c2-c <= 10*time.Millisecond {
			return time.Since(t0) - 200*time.Millisecond
		}
		if time.Since(t0) > limit {
			t.Fatalf("the server still uses the CPU %v after its client left (%v in the last 200 ms)", time.Since(t0), c2-c)
		}
		c = c2
	}
}

// admissionServer serves the random-weight tiny.en Whisper model with room for one
// transcription and none waiting, warmed up by one short transcription (which allocates what
// every transcription then reuses: the encoder's and decoder's state, a window's
// cross-attention memory).
func admissionServer(t *testing.T) *serverProc {
	t.Helper()
	srv := startServer(t, "--backend", asrBackend(), "-m", "whisper="+sharedtest.WhisperRandomModel(t, "tiny.en"),
		"--asr-parallel", "1", "--asr-queue", "0")
	wav, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/psx-cards-001.wav"))
	if err != nil {
		t.Fatal(err)
	}
	if code, _, body := postTranscription(t, srv.base, wav, "model", "whisper"); code != 200 {
		t.Fatalf("warm-up transcription: %d %s", code, body)
	}
	return srv
}

// TestTranscriptionMemoryBounded: a two-hour upload (a 340 kB FLAC of 115 million samples) is
// transcribed in bounded memory. What a transcription holds is its upload, two windows of log-mel
// (1.9 MB for 80 mel bins), a second of samples and the decoders' buffers; decoding the whole
// recording first would hold 460 MB of samples and 230 MB of log-mel. The FLAC decoder leaves
// its frames' samples as garbage (460 MB a pass), which the Go collector lets grow to as much as
// the heap live after the previous collection (GOGC=100) before collecting it: here the model,
// about 90 MB. So the bound on the rise of the server's peak resident memory, over the first pass
// over the audio and the first windows, above what it was after a short transcription, is that
// headroom (the live heap after the warm-up, times GOGC/100) plus 48 MiB. Then the client leaves,
// and the server stops using the CPU within a window's work.
func TestTranscriptionMemoryBounded(t *testing.T) {
	srv := admissionServer(t)
	pid := srv.cmd.Process.Pid
	headroom := int64(metric(t, srv.base, "go_memstats_heap_alloc_bytes") * metric(t, srv.base, "go_gc_gogc_percent") / 100)
	bound := headroom + 48<<20
	hwm0, steps0 := procKB(t, pid, "VmHWM"), speechSteps(t, srv.base)
	file := sharedtest.SquareFLAC(t, 2*3600)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- postAudio(ctx, srv.base, file, "audio/flac") }()
	// The first pass over the audio takes no step; each window then takes an encoder step or
	// more and a decoder step a token.
	t0 := time.Now()
	for speechSteps(t, srv.base) < steps0+100 {
		select {
		case err := <-done:
			t.Fatalf("the transcription ended: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Since(t0) > 5*time.Minute {
			t.Fatalf("the server took no step in 5 minutes (%d steps)", speechSteps(t, srv.base)-steps0)
		}
	}
	hwm := procKB(t, pid, "VmHWM")
	t.Logf("peak resident memory %.1f MiB after the warm-up, %.1f MiB %v into a two-hour transcription (+%.1f MiB, bound %.1f MiB)",
		float64(hwm0)/(1<<20), float64(hwm)/(1<<20), time.Since(t0).Round(time.Second), float64(hwm-hwm0)/(1<<20), float64(bound)/(1<<20))
	if hwm-hwm0 > bound {
		t.Errorf("a two-hour transcription raised the peak resident memory by %.1f MiB, more than %.1f MiB (the collector's headroom %.1f MiB plus 48 MiB)",
			float64(hwm-hwm0)/(1<<20), float64(bound)/(1<<20), float64(headroom)/(1<<20))
	}
	cancel()
	<-done
	t.Logf("the server stopped using the CPU %v after its client left", waitIdle(t, pid, 10*time.Second).Round(10*time.Millisecond))
}

// TestTranscriptionCancelStopsCPU: a client that leaves while its two-hour upload is being read
// (the first pass over the audio, seconds of CPU) frees the server within a window's work: the
// process stops using the CPU, and the next transcription is admitted.
func TestTranscriptionCancelStopsCPU(t *testing.T) {
	srv := admissionServer(t)
	pid := srv.cmd.Process.Pid
	file := sharedtest.SquareFLAC(t, 2*3600)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	cpu0 := procCPU(t, pid)
	go func() { done <- postAudio(ctx, srv.base, file, "audio/flac") }()
	for procCPU(t, pid)-cpu0 < time.Second {
		select {
		case err := <-done:
			t.Fatalf("the transcription ended: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	<-done
	idle := waitIdle(t, pid, 10*time.Second)
	t.Logf("the server stopped using the CPU %v after its client left, %v of CPU into its upload", idle.Round(10*time.Millisecond), procCPU(t, pid)-cpu0)
	if idle > 2*time.Second {
		t.Errorf("the server used the CPU for %v after its client left, more than a window's work", idle)
	}
	wav, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/psx-cards-001.wav"))
	if err != nil {
		t.Fatal(err)
	}
	if code, _, body := postTranscription(t, srv.base, wav, "model", "whisper"); code != 200 {
		t.Errorf("the next transcription: %d %s", code, body)
	}
}

// TestTranscriptionAdmissionRefusesFast: while the server's one transcription runs (a two-hour
// FLAC, in the first pass over its audio), every upload is refused for the full queue (429)
// within 100 ms of its arrival, from its headers, whatever it holds: a second two-hour FLAC, a
// two-hour 1 kHz WAV (7 MB, 115 million samples once resampled; decoding it first took 52 s),
// a FLAC whose header states three hours, bytes in no audio format. Once the queue has room,
// the last two are refused from the audio's header before any decoding, within 100 ms of their
// last byte: 400 for the three hours, 415 for the format.
func TestTranscriptionAdmissionRefusesFast(t *testing.T) {
	sameInBothBuilds(t)
	srv := admissionServer(t)
	pid := srv.cmd.Process.Pid
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	cpu0 := procCPU(t, pid)
	go func() { done <- postAudio(ctx, srv.base, sharedtest.SquareFLAC(t, 2*3600), "audio/flac") }()
	for procCPU(t, pid)-cpu0 < 500*time.Millisecond {
		select {
		case err := <-done:
			t.Fatalf("the running transcription ended: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	expectRefusals(t, srv.base, []refusal{
		{"two-hour FLAC, queue full", "audio/flac", sharedtest.SquareFLAC(t, 2*3600), 429, "queue_full", 100 * time.Millisecond},
		{"two-hour WAV, queue full", "audio/wav", lowRateWAV(7140), 429, "queue_full", 100 * time.Millisecond},
		{"three-hour FLAC, queue full", "audio/flac", sharedtest.SquareFLAC(t, 3*3600), 429, "queue_full", 100 * time.Millisecond},
		{"not audio, queue full", "application/pdf", bytes.Repeat([]byte("%PDF-1.4 not audio "), 1000), 429, "queue_full", 100 * time.Millisecond},
	})
	select {
	case err := <-done:
		t.Fatalf("the running transcription ended: %v", err)
	default:
	}
	cancel()
	<-done
	waitIdle(t, pid, 10*time.Second)
	expectRefusals(t, srv.base, []refusal{
		{"three-hour FLAC", "audio/flac", sharedtest.SquareFLAC(t, 3*3600), 400, "audio_too_long", 100 * time.Millisecond},
		{"not audio", "application/pdf", bytes.Repeat([]byte("%PDF-1.4 not audio "), 1000), 415, "unsupported_format", 100 * time.Millisecond},
	})
}

// refusal is an upload the server must refuse, with status and code, within bound (postAudioTimed).
type refusal struct {
	name, fileType string
	file           []byte
	status         int
	code           string
	bound          time.Duration
}

// expectRefusals posts each upload three times and checks its answer and the slowest time.
func expectRefusals(t *testing.T, base string, cases []refusal) {
	t.Helper()
	for _, c := range cases {
		var worst time.Duration
		for range 3 {
			code, body, took, err := postAudioTimed(context.Background(), base, c.file, c.fileType)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if code != c.status || !strings.Contains(body, c.code) {
				t.Fatalf("%s: %d %s, want %d %s", c.name, code, body, c.status, c.code)
			}
			worst = max(worst, took)
		}
		t.Logf("%s (%d bytes): %d in %v at worst", c.name, len(c.file), c.status, worst.Round(100*time.Microsecond))
		if worst > c.bound {
			t.Errorf("%s: answered %d %v after it arrived or its last byte was sent, want within %v", c.name, c.status, worst, c.bound)
		}
	}
}
