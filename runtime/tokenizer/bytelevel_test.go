package tokenizer

import "testing"

func TestByteLevelRoundTrip(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	s := ByteLevel(all)
	if ByteLevel([]byte(" the\n")) != "Ġthe\u010a" {
		t.Errorf("ByteLevel(\" the\\n\") = %q", ByteLevel([]byte(" the\n")))
	}
	b, ok := FromByteLevel(s)
	if !ok || string(b) != string(all) {
		t.Fatalf("round trip of every byte: %v, %q", ok, b)
	}
	for _, bad := range []string{"中", "\xff", "a\u0144"} {
		if _, ok := FromByteLevel(bad); ok {
			t.Errorf("FromByteLevel(%q) accepted", bad)
		}
	}
}
