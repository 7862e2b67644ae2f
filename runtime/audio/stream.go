package audio

import (
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync"
	"time"
)

// Stream is a recording read block by block as 16 kHz mono float32 samples. Read fills dst with
// the next samples and returns how many, as io.Reader does: at the end it returns io.EOF (with
// the last samples or after them); any other error ends the stream.
type Stream interface {
	Read(dst []float32) (int, error)
}

// Source is a recording that can be read from its start as often as a reader needs: a
// recogniser that normalises by the whole recording reads it twice (Whisper's log-mel), one that
// consumes it chunk by chunk once. Open is safe for concurrent use; each Stream it returns is
// read by one goroutine.
type Source interface {
	Open() (Stream, error)
}

// Samples is a Source over samples already in memory (16 kHz mono); its streams read the slice
// in place.
func Samples(s []float32) Source { return samplesSource(s) }

type samplesSource []float32

func (s samplesSource) Open() (Stream, error) { return &samplesStream{s: s}, nil }

type samplesStream struct {
	s   []float32
	pos int
}

func (r *samplesStream) Read(dst []float32) (int, error) {
	n := copy(dst, r.s[r.pos:])
	r.pos += n
	if r.pos == len(r.s) {
		return n, io.EOF
	}
	return n, nil
}

// File is an encoded audio file held in memory (an upload) as a Source: NewFile reads its header
// (format, rate, channels and the duration where the header states it, checked against the
// limit) without decoding any audio, and every Open decodes it anew with a Decoder, so that what
// is held at once is the encoded bytes and a decoder's buffers, never the whole decoded signal.
type File struct {
	data []byte
	opt  Options
	info Info

	mu    sync.Mutex
	first *Decoder // the decoder NewFile opened, for the first Open
}

// NewFile checks data's header as NewDecoder does and returns it as a Source. Errors wrap
// ErrUnsupported, ErrCorrupt or ErrTooLong.
func NewFile(data []byte, opt Options) (*File, error) {
	d, err := NewDecoder(data, opt)
	if err != nil {
		return nil, err
	}
	return &File{data: data, opt: opt, info: d.Info(), first: d}, nil
}

// Info is what the header says (Decoder.Info before reading).
func (f *File) Info() Info { return f.info }

// Open returns a Decoder of the file from its start.
func (f *File) Open() (Stream, error) {
	f.mu.Lock()
	d := f.first
	f.first = nil
	f.mu.Unlock()
	if d != nil {
		return d, nil
	}
	return NewDecoder(f.data, f.opt)
}

// blockReader reads one stream's samples, mixed down to mono, at the stream's own rate.
type blockReader interface {
	// next returns the next block, valid until the following call, with the error that ended
	// the stream after it, if any: io.EOF at its end.
	next() ([]float32, error)
}

// trimmer is a blockReader whose output is cut at a length it learns while reading (Opus:
// its last granule position): endAt is the number of output samples kept, or -1 for all.
type trimmer interface {
	endAt() int64
}

// opened is a format's decoder once its header has been read.
type opened struct {
	info      Info // Codec, Channels, BitsPerSample (and SampleRate, Frames, Duration where they differ from rate and declared)
	rate      int  // of the blocks
	declared  int64
	confirmed bool // the input's size proves declared (PCM)
	src       blockReader
	// finish, if set, completes the Info at the end from the input frames kept; otherwise
	// SampleRate is rate and Frames the input frames.
	finish func(info *Info, frames int64)
}

// Decoder decodes an audio file held in memory to mono float32 at Options.SampleRate (16 kHz by
// default) block by block (a Stream): each format's decoder yields a block at a time (a WAV
// chunk, a FLAC frame, an MP3 or Vorbis read, an Opus packet), its channels averaged, resampled
// as it comes by a Resampler.
// It holds one block and its resampled output beside the input, whatever the recording's
// length. What it reads equals what DecodeWith returns, sample for sample. A Decoder is not safe
// for concurrent use.
type Decoder struct {
	format    Format
	info      Info // the header's; complete once the stream has ended
	rate      int
	src       blockReader
	finish    func(info *Info, frames int64)
	declared  int64
	confirmed bool
	maxFrames int64
	frames    int64 // input frames decoded (and kept)
	rs        *Resampler
	end       int64     // input frames kept, as the source states it (-1: all)
	buf       []float32 // output not yet read: buf[pos:]
	pos       int
	err       error // what ends the stream once buf is read: io.EOF or a failure
}

// NewDecoder sniffs data's format (opt.ContentType helps where the bytes are ambiguous) and reads
// its header: a format it does not decode, a malformed header, or a duration the header states
// beyond opt.MaxDuration fails here, before any audio is decoded. Errors wrap ErrUnsupported,
// ErrCorrupt or ErrTooLong.
func NewDecoder(data []byte, opt Options) (d *Decoder, err error) {
	maxDur := opt.MaxDuration
	if maxDur == 0 {
		maxDur = DefaultMaxDuration
	}
	if maxDur < 0 {
		return nil, fmt.Errorf("audio: negative duration limit %v", maxDur)
	}
	outRate := opt.SampleRate
	if outRate == 0 {
		outRate = SampleRate
	}
	if outRate < MinRate || outRate > MaxRate {
		return nil, fmt.Errorf("audio: output sample rate %d Hz outside [%d, %d]", outRate, MinRate, MaxRate)
	}
	f, body, err := detect(data, opt.ContentType)
	if err != nil {
		return nil, err
	}
	lim := limits{maxDur: maxDur, inputBytes: len(data)}
	defer func() {
		if p := recover(); p != nil {
			d, err = nil, codecPanic(f, p)
		}
	}()
	var o opened
	switch f {
	case FormatWAV:
		o, err = openWAV(body)
	case FormatFLAC:
		o, err = openFLAC(body)
	case FormatMP3:
		o, err = openMP3(body)
	case FormatVorbis:
		o, err = openVorbis(body)
	case FormatOpus:
		o, err = openOpus(body, outRate)
	default:
		err = fmt.Errorf("audio: format %q: %w", f, ErrUnsupported)
	}
	if err != nil {
		return nil, err
	}
	if o.rate < MinRate || o.rate > MaxRate {
		return nil, fmt.Errorf("audio: sample rate %d Hz outside [%d, %d]: %w", o.rate, MinRate, MaxRate, ErrUnsupported)
	}
	rs, err := NewResampler(o.rate, outRate)
	if err != nil {
		return nil, err
	}
	d = &Decoder{format: f, info: o.info, rate: o.rate, src: o.src, finish: o.finish, declared: o.declared,
		confirmed: o.confirmed, maxFrames: lim.maxFrames(o.rate), rs: rs, end: -1}
	d.info.Format = f
	if d.info.SampleRate == 0 { // else the format states its header's rate and length itself
		d.info.SampleRate = o.rate
		if o.declared > 0 {
			d.info.Frames = o.declared
			d.info.Duration = samplesDuration(o.declared, o.rate)
		}
	}
	if o.declared > d.maxFrames {
		return nil, d.tooLong(o.declared)
	}
	return d, nil
}

// codecPanic is the error a panic inside a third-party codec becomes: it was fed untrusted
// bytes, so the stream is malformed.
func codecPanic(f Format, p any) error {
	if panicHook != nil {
		panicHook(p, debug.Stack())
	}
	return fmt.Errorf("audio: %s decoder failed: %v: %w", f, p, ErrCorrupt)
}

func (d *Decoder) tooLong(frames int64) error {
	return fmt.Errorf("audio: %v of audio (at least) exceeds the limit of %v: %w",
		samplesDuration(frames, d.rate).Round(time.Millisecond), samplesDuration(d.maxFrames, d.rate).Round(time.Millisecond), ErrTooLong)
}

// Info describes the input. Before the stream has ended, Frames and Duration are what the header
// declares (zero where it does not); at its end they are what was decoded.
func (d *Decoder) Info() Info { return d.info }

// Read fills dst with the next samples (Stream).
func (d *Decoder) Read(dst []float32) (n int, err error) {
	defer func() {
		if p := recover(); p != nil {
			d.buf, d.pos, d.err = nil, 0, codecPanic(d.format, p)
			err = d.err
		}
	}()
	for n < len(dst) {
		if d.pos < len(d.buf) {
			c := copy(dst[n:], d.buf[d.pos:])
			d.pos += c
			n += c
			continue
		}
		if d.err != nil {
			return n, d.err
		}
		d.fill()
	}
	if d.pos == len(d.buf) && d.err != nil {
		return n, d.err
	}
	return n, nil
}

// readAll appends the rest of the stream to out.
func (d *Decoder) readAll(out []float32) (_ []float32, err error) {
	defer func() {
		if p := recover(); p != nil {
			d.buf, d.pos, d.err = nil, 0, codecPanic(d.format, p)
			err = d.err
		}
	}()
	for {
		out = append(out, d.buf[d.pos:]...)
		d.pos = len(d.buf)
		if d.err != nil {
			break
		}
		d.fill()
	}
	if !errors.Is(d.err, io.EOF) {
		return nil, d.err
	}
	return out, nil
}

// fill decodes the next block into buf, or sets err.
func (d *Decoder) fill() {
	d.buf, d.pos = d.buf[:0], 0
	block, err := d.src.next()
	if t, ok := d.src.(trimmer); ok {
		d.end = t.endAt()
	}
	if d.end >= 0 && d.frames+int64(len(block)) > d.end { // trimmed in the source's frames, before resampling
		block = block[:max(d.end-d.frames, 0)]
	}
	if len(block) > 0 {
		if d.frames+int64(len(block)) > d.maxFrames {
			d.err = d.tooLong(d.frames + int64(len(block)))
			return
		}
		d.frames += int64(len(block))
		d.buf = d.rs.Process(d.buf, block)
	}
	switch {
	case errors.Is(err, io.EOF):
		d.buf = d.rs.Flush(d.buf)
		d.err = io.EOF
	case err != nil:
		d.buf, d.err = d.buf[:0], err
		return
	}
	if d.err == io.EOF {
		d.info.SampleRate = d.rate
		d.info.Frames = d.frames
		d.info.Duration = samplesDuration(d.frames, d.rate)
		if d.finish != nil {
			d.finish(&d.info, d.frames)
		}
	}
}
