package server

import (
	"embed"
	"slices"
	"strings"
)

// builtinTemplates are chat templates for models whose files have none, under llama-server's
// names for them (its --chat-template): Jinja sources that render what the Hugging Face
// templates of those models render (chatml: the ChatML turns of OpenHermes and Qwen; llama2:
// Llama 2 Chat; llama3: Llama 3 Instruct; mistral-v1: Mistral 7B Instruct v0.1 and v0.2;
// mistral-v3: v0.3, the system message before the last user message; phi3: Phi-3 mini; gemma:
// Gemma, a system message put before the first user message as Gemma 3's template does;
// zephyr: Zephyr 7B beta).
//
//go:embed chattemplates/*.jinja
var builtinTemplates embed.FS

// ChatTemplateNames lists the built-in chat templates, sorted.
func ChatTemplateNames() []string {
	ents, _ := builtinTemplates.ReadDir("chattemplates")
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, strings.TrimSuffix(e.Name(), ".jinja"))
	}
	slices.Sort(names)
	return names
}

// BuiltinChatTemplate returns the source of the built-in chat template called name.
func BuiltinChatTemplate(name string) (string, bool) {
	if !slices.Contains(ChatTemplateNames(), name) {
		return "", false
	}
	b, err := builtinTemplates.ReadFile("chattemplates/" + name + ".jinja")
	return string(b), err == nil
}

// CheckChatTemplate reports whether src, a chat template's Jinja source, compiles.
func CheckChatTemplate(src string) error {
	_, err := parseChatTemplate(src, "", "")
	return err
}
