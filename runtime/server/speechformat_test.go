package server

import (
	"bufio"
	"bytes"
	"crypto/md5"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/mewkiz/flac"
)

// flacSamples decodes a FLAC stream with mewkiz/flac (every frame's CRC checked) to 16-bit
// little-endian bytes, with its STREAMINFO's total and MD5.
func flacSamples(t *testing.T, data []byte) (pcm []byte, total uint64, sum [16]byte) {
	t.Helper()
	st, err := flac.New(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if st.Info.SampleRate != 24000 || st.Info.NChannels != 1 || st.Info.BitsPerSample != 16 {
		t.Fatalf("STREAMINFO %+v: want 16-bit mono 24 kHz", st.Info)
	}
	for {
		fr, err := st.ParseNext()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("frame after %d samples: %v", len(pcm)/2, err)
		}
		for _, v := range fr.Subframes[0].Samples {
			pcm = binary.LittleEndian.AppendUint16(pcm, uint16(int16(v)))
		}
	}
	return pcm, st.Info.NSamples, st.Info.MD5sum
}

// sseDeltas reads a speech event stream: the bytes of its deltas in order, and its done event.
func sseDeltas(t *testing.T, body []byte) ([]byte, map[string]any, int) {
	t.Helper()
	var audio []byte
	var done map[string]any
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("a line that is not data: %.80q", line)
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("%v: %.80s", err, data)
		}
		if done != nil {
			t.Fatalf("an event after speech.audio.done: %.80s", data)
		}
		switch ev["type"] {
		case "speech.audio.delta":
			b, err := base64.StdEncoding.DecodeString(ev["audio"].(string))
			if err != nil {
				t.Fatal(err)
			}
			audio = append(audio, b...)
			n++
		case "speech.audio.done":
			done = ev
		default:
			t.Fatalf("event %.80s", data)
		}
	}
	if done == nil {
		t.Fatal("no speech.audio.done")
	}
	return audio, done, n
}

// TestSpeechFormats: every response format, whole, streamed and as events, holds exactly the
// synthesiser's samples: WAV with its length or (streamed) 0xFFFFFFFF, FLAC that mewkiz/flac
// decodes to the samples, with the total and the samples' MD5 when whole and "unknown" when
// streamed; the events' deltas are the streamed bytes, one per frame, and the done event
// counts the input's tokens and the frames.
func TestSpeechFormats(t *testing.T) {
	sp := &fakeSpeaker{frames: 3}
	srv := newTTSServer(t, sp)
	url := srv.URL + "/v1/audio/speech"
	want := fakePCM(3)
	le := binary.LittleEndian
	for _, format := range []string{"wav", "flac", "pcm"} {
		for _, stream := range []string{"", "audio", "sse"} {
			name := format + "/" + stream
			req := `{"input":"Hello there you.","voice":"alba","response_format":"` + format + `"`
			if stream != "" {
				req += `,"stream_format":"` + stream + `"`
			}
			code, body, h := post(t, url, "application/json", []byte(req+"}"))
			if code != http.StatusOK || h.Get("X-Sample-Rate") != "24000" {
				t.Fatalf("%s: %d rate %q: %.200s", name, code, h.Get("X-Sample-Rate"), body)
			}
			ct := map[string]string{"wav": "audio/wav", "flac": "audio/flac", "pcm": "audio/pcm"}[format]
			if stream == "sse" {
				if h.Get("Content-Type") != "text/event-stream" || h.Get("X-Audio-Content-Type") != ct {
					t.Errorf("%s: Content-Type %q, X-Audio-Content-Type %q", name, h.Get("Content-Type"), h.Get("X-Audio-Content-Type"))
				}
				var done map[string]any
				var deltas int
				body, done, deltas = sseDeltas(t, body)
				if deltas != 3 {
					t.Errorf("%s: %d deltas, want one a frame", name, deltas)
				}
				u, _ := done["usage"].(map[string]any)
				if u["input_tokens"] != 3.0 || u["output_tokens"] != 3.0 || u["total_tokens"] != 6.0 {
					t.Errorf("%s: done %v", name, done)
				}
			} else if h.Get("Content-Type") != ct {
				t.Errorf("%s: Content-Type %q", name, h.Get("Content-Type"))
			}
			whole := stream == "" && format != "pcm"
			if whole != (h.Get("Content-Length") != "") && stream != "sse" {
				t.Errorf("%s: Content-Length %q", name, h.Get("Content-Length"))
			}
			switch format {
			case "pcm":
				if !bytes.Equal(body, want) {
					t.Errorf("%s: %d bytes unlike the synthesiser's %d", name, len(body), len(want))
				}
			case "wav":
				size := uint32(len(want))
				if !whole {
					size = math.MaxUint32
				}
				if len(body) != 44+len(want) || le.Uint32(body[40:]) != size || le.Uint32(body[24:]) != 24000 || !bytes.Equal(body[44:], want) {
					t.Errorf("%s: %d bytes, data size %#x; want %d samples behind a size of %#x", name, len(body), le.Uint32(body[40:]), len(want)/2, size)
				}
			case "flac":
				got, total, sum := flacSamples(t, body)
				wantTotal, wantSum := uint64(0), [16]byte{}
				if whole {
					wantTotal, wantSum = uint64(len(want)/2), md5.Sum(want)
				}
				if !bytes.Equal(got, want) || total != wantTotal || sum != wantSum {
					t.Errorf("%s: %d samples (total %d, MD5 %x); want the synthesiser's %d (total %d, MD5 %x)", name, len(got)/2, total, sum, len(want)/2, wantTotal, wantSum)
				}
			}
		}
	}
}

// TestSpeechStreamsAsMade: with stream_format "audio" (and "sse"), the header and first frame
// reach the client while the synthesiser still holds the second; and a failing synthesis
// before any frame is still a JSON error, after one an event stream's error event.
func TestSpeechStreamsAsMade(t *testing.T) {
	sp := &fakeSpeaker{frames: 2, gate: make(chan struct{})}
	srv := newTTSServer(t, sp)
	for _, c := range []struct{ format, stream string }{{"wav", "audio"}, {"flac", "audio"}, {"pcm", "sse"}} {
		body := `{"input":"Hi.","voice":"alba","response_format":"` + c.format + `","stream_format":"` + c.stream + `"}`
		resp, err := http.Post(srv.URL+"/v1/audio/speech", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		first := make([]byte, 40)
		if _, err := io.ReadFull(resp.Body, first); err != nil {
			t.Fatalf("%s/%s: %v", c.format, c.stream, err)
		}
		sp.gate <- struct{}{} // only now is the second frame made
		rest, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || len(rest) == 0 {
			t.Errorf("%s/%s: %d %v", c.format, c.stream, resp.StatusCode, err)
		}
	}
	code, b, _ := post(t, srv.URL+"/v1/audio/speech", "application/json", []byte(`{"input":"boom","voice":"alba","stream_format":"sse"}`))
	if code != 500 || !strings.Contains(string(b), `"error"`) {
		t.Errorf("a failure before any frame: %d %s", code, b)
	}
	code, b, _ = post(t, srv.URL+"/v1/audio/speech", "application/json", []byte(`{"input":"late boom","voice":"alba","stream_format":"sse"}`))
	events := strings.Split(strings.TrimSpace(string(b)), "\n\n")
	if last := events[len(events)-1]; code != 200 || len(events) != 2 || !strings.HasPrefix(last, `data: {"type":"error","error":{`) || !strings.Contains(last, "server_error") {
		t.Errorf("a failure after a frame: %d, events %q", code, events)
	}
}
