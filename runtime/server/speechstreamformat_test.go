package server

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/runtime/audio"
)

// speakSession runs a live session with query, the events sent in order, and returns its
// messages, its audio joined, and its close status.
func speakSession(t *testing.T, query string, events ...string) ([]speakMsg, []byte, websocket.StatusCode) {
	t.Helper()
	_, srv := newSpeakServer(t, &fakeSpeaker{frames: 2}, Config{})
	c, code := dialSpeak(t, srv, query, nil)
	if c == nil {
		t.Fatalf("dial %s: %d", query, code)
	}
	for _, ev := range events {
		sendJSON(t, c, ev)
	}
	ms, cs := readUntilClose(t, c)
	var joined []byte
	for _, m := range ms {
		if m.Type == "audio" {
			joined = append(joined, m.audio...)
		}
	}
	return ms, joined, cs
}

// TestSpeechStreamFormats: a live session's response_format (the query's, or a "config" event's
// before any text) makes its binary messages one file of that format: PCM as it is; a WAV
// stream whose header (sizes unknown) is the first message, then the same PCM; a FLAC stream
// whose header is the first message, then one FLAC frame a frame, decoding to the same samples;
// "ready" and "configured" name the format. A bad format is a 400 before the upgrade in the
// query, an error event (invalid_response_format, close 1008) in a config event; a config event
// after text, or a response_format on another event, is an invalid_event.
func TestSpeechStreamFormats(t *testing.T) {
	text := []string{`{"type":"text","text":"One. Two."}`, `{"type":"close"}`}
	ms, pcm, cs := speakSession(t, "?voice=alba", text...)
	if got := summary(ms); got != "ready segment:One. audio×2 segment:Two. audio×2 done" || cs != websocket.StatusNormalClosure || ms[0].Format != "pcm_s16le" || ms[0].ResponseFormat != "pcm" || len(pcm) != 4*3840 {
		t.Fatalf("pcm: %s (close %d), ready %+v, %d bytes", got, cs, ms[0], len(pcm))
	}
	samples := make([]float32, len(pcm)/2)
	audio.PCM16ToFloat(samples, pcm)

	ms, wav, cs := speakSession(t, "?voice=alba&response_format=wav", text...)
	hdr, _ := audio.WAVStreamHeader(24000)
	if got := summary(ms); got != "ready segment:One. audio×3 segment:Two. audio×2 done" || cs != websocket.StatusNormalClosure || ms[0].ResponseFormat != "wav" ||
		!bytes.Equal(ms[2].audio, hdr) || !bytes.Equal(wav, append(hdr, pcm...)) {
		t.Errorf("wav: %s (close %d), %d bytes, first message % x", got, cs, len(wav), ms[2].audio[:min(12, len(ms[2].audio))])
	}
	if dec, _, err := audio.DecodeWith(wav, audio.Options{SampleRate: 24000}); err != nil || !equalSamples(dec, samples) {
		t.Errorf("the WAV stream decodes to %d samples (want %d): %v", len(dec), len(samples), err)
	}

	for _, query := range []string{"?voice=alba&response_format=flac", "?voice=alba&response_format=wav"} {
		events := append([]string{`{"type":"config","response_format":"flac"}`}, text...)
		if query == "?voice=alba&response_format=flac" {
			events = text
		}
		ms, flac, cs := speakSession(t, query, events...)
		want := "ready segment:One. audio×3 segment:Two. audio×2 done"
		if len(events) > len(text) {
			want = "ready configured segment:One. audio×3 segment:Two. audio×2 done"
		}
		if got := summary(ms); got != want || cs != websocket.StatusNormalClosure {
			t.Errorf("flac %s: %s (close %d)", query, got, cs)
		}

		var first []byte
		for _, m := range ms {
			if m.Type == "audio" {
				first = m.audio
				break
			}
		}
		if string(first[:4]) != "fLaC" {
			t.Errorf("flac %s: the first message starts % x", query, first[:min(8, len(first))])
		}
		if rf := ms[len(events)-len(text)].ResponseFormat; rf != "flac" {
			t.Errorf("flac %s: %q announces response_format %q", query, ms[len(events)-len(text)].Type, rf)
		}
		dec, info, err := audio.DecodeWith(flac, audio.Options{SampleRate: 24000})
		if err != nil || info.Format != audio.FormatFLAC || !equalSamples(dec, samples) {
			t.Errorf("flac %s: decodes to %d samples (want %d) as %+v: %v", query, len(dec), len(samples), info, err)
		}
	}

	// bad formats and misplaced events
	_, srv := newSpeakServer(t, &fakeSpeaker{frames: 1}, Config{})
	if c, code := dialSpeak(t, srv, "?voice=alba&response_format=mp3", nil); c != nil || code != http.StatusBadRequest {
		t.Errorf("response_format=mp3 in the query: %d", code)
	}
	for _, c := range []struct {
		events []string
		want   string
	}{
		{[]string{`{"type":"config","response_format":"mp3"}`}, "ready error:invalid_response_format"},
		{[]string{`{"type":"config"}`}, "ready error:invalid_event"},
		{[]string{`{"type":"text","text":"Hi"}`, `{"type":"config","response_format":"wav"}`}, "ready error:invalid_event"},
		{[]string{`{"type":"text","text":"Hi","response_format":"wav"}`}, "ready error:invalid_event"},
	} {
		ms, _, cs := speakSession(t, "?voice=alba", c.events...)
		if got := summary(ms); got != c.want || cs != websocket.StatusPolicyViolation {
			t.Errorf("%v: %s (close %d), want %s and 1008", c.events, got, cs, c.want)
		}
	}
}

func equalSamples(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSpeechStreamFormatsNothingSpoken: a WAV or FLAC session closed before any text still sends
// its format's header, so its binary messages are an empty file of that format; PCM sends
// nothing.
func TestSpeechStreamFormatsNothingSpoken(t *testing.T) {
	for _, f := range []string{"pcm", "wav", "flac"} {
		ms, joined, cs := speakSession(t, "?voice=alba&response_format="+f, `{"type":"close"}`)
		want := "ready audio×1 done"
		if f == "pcm" {
			want = "ready done"
		}
		if got := summary(ms); got != want || cs != websocket.StatusNormalClosure {
			t.Errorf("%s: %s (close %d), want %s", f, got, cs, want)
			continue
		}
		switch f {
		case "wav":
			hdr, _ := audio.WAVStreamHeader(24000)
			if !bytes.Equal(joined, hdr) {
				t.Errorf("wav: % x, want the stream header", joined)
			}
		case "flac":
			if !bytes.HasPrefix(joined, []byte("fLaC")) {
				t.Errorf("flac: % x, want a FLAC header", joined[:min(8, len(joined))])
			}
		}
		if f != "pcm" {
			if dec, _, err := audio.DecodeWith(joined, audio.Options{SampleRate: 24000}); err != nil || len(dec) != 0 {
				t.Errorf("%s: the empty stream decodes to %d samples: %v", f, len(dec), err)
			}
		}
	}
}
