package server

import (
	"strings"
	"testing"
)

// TestBuiltinChatTemplatesAgainstJinja2: every built-in template renders every test
// conversation here as jinja2 renders it (or raises the same exception).
func TestBuiltinChatTemplatesAgainstJinja2(t *testing.T) {
	var srcs []namedTemplate
	for _, n := range ChatTemplateNames() {
		src, ok := BuiltinChatTemplate(n)
		if !ok {
			t.Fatalf("%s listed but not found", n)
		}
		srcs = append(srcs, namedTemplate{n, src})
	}
	compareWithJinja2(t, srcs)
}

// TestBuiltinChatTemplates: each built-in template renders a system message and two user turns
// around an assistant's as the Hugging Face template of its models renders them (the expected
// texts are those templates' output, written out by hand from their sources), with "<s>" and
// "</s>" as the BOS and EOS tokens.
func TestBuiltinChatTemplates(t *testing.T) {
	conv := []message{{"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}}
	want := map[string]string{
		"chatml":     "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n",
		"llama2":     "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]",
		"llama3":     "<s><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU2<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
		"mistral-v1": "<s> [INST] S\n\nU1 [/INST] A1</s> [INST] U2 [/INST]",
		"mistral-v3": "<s>[INST] U1[/INST] A1</s>[INST] S\n\nU2[/INST]",
		"phi3":       "<|system|>\nS<|end|>\n<|user|>\nU1<|end|>\n<|assistant|>\nA1<|end|>\n<|user|>\nU2<|end|>\n<|assistant|>\n",
		"gemma":      "<s><start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n",
		"zephyr":     "<|system|>\nS</s>\n<|user|>\nU1</s>\n<|assistant|>\nA1</s>\n<|user|>\nU2</s>\n<|assistant|>\n",
	}
	names := ChatTemplateNames()
	for _, required := range []string{"chatml", "llama2", "llama3", "mistral-v1", "mistral-v3", "phi3", "gemma", "zephyr"} {
		if _, ok := BuiltinChatTemplate(required); !ok {
			t.Errorf("no built-in template %q (have %s)", required, strings.Join(names, ", "))
		}
	}
	for _, n := range names {
		w, ok := want[n]
		if !ok {
			t.Errorf("%s: no expected rendering", n)
			continue
		}
		src, _ := BuiltinChatTemplate(n)
		if err := CheckChatTemplate(src); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		tm, _ := parseChatTemplate(src, "<s>", "</s>")
		got, err := tm.render(conv, nil)
		if err != nil || got != w {
			t.Errorf("%s:\n got %q, %v\nwant %q", n, got, err, w)
		}
	}
	if _, ok := BuiltinChatTemplate("../template"); ok {
		t.Error("a path was taken for a built-in name")
	}
}
