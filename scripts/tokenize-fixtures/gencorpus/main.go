// Command gencorpus writes the tokenizer parity corpus: a JSON array of
// strings, the same bytes on every run (fixed seed), gzip-compressed.
//
//	go run ./scripts/tokenize-fixtures/gencorpus -out router/tokenize/testdata/corpus.json.gz
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
)

func main() {
	out := flag.String("out", "corpus.json.gz", "output file (gzip-compressed JSON array of strings)")
	n := flag.Int("n", 3200, "number of strings")
	flag.Parse()
	if err := write(*out, corpus(*n)); err != nil {
		fmt.Fprintln(os.Stderr, "gencorpus:", err)
		os.Exit(1)
	}
}

func write(path string, c []string) error {
	var js bytes.Buffer
	enc := json.NewEncoder(&js)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(c); err != nil {
		return err
	}
	var gz bytes.Buffer
	w, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return err
	}
	if _, err := w.Write(js.Bytes()); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, gz.Bytes(), 0o644)
}

// fixed cases: edge cases worth naming one by one.
var fixed = []string{
	"", " ", "  ", "\t", "\n", "\r\n", "\n\n\n", " \n ", "a", "A", "é", "中", "🙂", "0", "!", "'", "\u00a0",
	"Hello world", " Hello world", "Hello  world", "Hello world ", "hello\tworld", "Hello\r\nworld\r\n",
	"I'm you're we've they'll he'd it's", "I'M YOU'RE WE'VE THEY'LL HE'D IT'S", "'s 't 're 've 'm 'll 'd",
	"it'ſ the long s", "don’t curly apostrophe’s", "''s '''", "rock'n'roll", "'S 'T 'Re 'vE 'M 'LL 'D",
	"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
	"<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", "<|im_start|><|im_end|>", "<|im_start", "|im_end|>",
	"<s>", "</s>", "<s>Hello</s>", "<s> Hello </s>", "Hello <s>world", "<unk>", "[INST]", "[INST] Hi [/INST]", "[INST]What?[/INST]Answer</s>",
	"<think>\nreasoning\n</think>\n\nanswer", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
	"<SPECIAL_20><SPECIAL_999>", "[AVAILABLE_TOOLS][/AVAILABLE_TOOLS]", "<<s>>", "<</s>", "<|im_start|>\n\n<|im_end|>",
	"e\u0301 cafe\u0301 nai\u0308ve A\u030a", "café naïve Å", "ﬁ ﬂ ① ㎏ Ⅻ ｆｕｌｌｗｉｄｔｈ", "\u1e9b\u0323",
	"👍🏽 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 ❤️ ✌🏿", "🧑🏻‍🤝‍🧑🏿", "a👍b", "😀😃😄😁😆😅😂🤣",
	"日本語のテキストです。", "中文文本，包含标点符号！", "한국어 텍스트입니다.", "العربية نص عربي", "हिन्दी पाठ", "ไทย ภาษาไทย", "Ελληνικά κείμενο", "Русский текст", "עברית",
	"a\u200bb\u200cc\u200dd", "\ufeffBOM", "\u2028\u2029", "\u3000full\u3000width\u3000space", "\u2003em\u2002en\u2009thin\u202fnarrow\u205fmath",
	"\u0085nel", "\x00\x01\x02\x1b[0m\x7f", "\x1c\x1d\x1e\x1f", "\U0010ffff\U000e0001\U000f0000", "\ue000 private use",
	"ǅ ǈ ǋ title case", "ʰʲʷ modifier letters", "ĲĳŒœß ẞ", "İstanbul ı", "Σίσυφος ΣΑΣ",
	"123", "1234567890", "3.14159 2,718 1e-10 -42 +7 0x1F 1_000_000", "٣٤٥ ۴۵۶ १२३ ௧௨௩ 二十三 Ⅳ ½ ²",
	"https://example.com/path?query=1&b=2#frag", "user@example.com", "C:\\Windows\\System32", "/usr/local/bin/",
	"{\"key\": [1, 2, {\"nested\": null}], \"s\": \"\\u00e9\"}", "# Title\n\n- item 1\n- item 2\n\n```go\nfmt.Println(1)\n```\n",
	"| a | b |\n|---|---|\n| 1 | 2 |", "**bold** _it_ `code` [link](http://x.y)", "    indented code\n\tand tab",
	"line1\nline2\r\nline3\rline4", "  \n\n  \t\t\n", "end with spaces   ", "   start with spaces", "x  \n  y", "a \r\n b",
	"!!!???...,,,;;;:::", "(((a)))", "$$$ %%% ^^^ &&& *** ___ +++ === ~~~ ``` ||| \\\\\\", "--> <-- => <= != ==", " ?!", " !\n\n", "?\n/", "a/\n/b",
}

var words = map[string][]string{
	"en":    {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Tokenizer", "inference", "cache", "router", "KV", "GPU", "latency", "don't", "can't", "I'll", "USA", "McDonald", "iPhone", "JSON", "HTTPServer"},
	"fr":    {"été", "français", "où", "naïve", "garçon", "Œuvre", "déjà"},
	"de":    {"Straße", "Größe", "übermäßig", "Äpfel", "ÖL"},
	"cjk":   {"東京", "大阪", "日本語", "中文", "学习", "模型", "推理", "缓存", "ひらがな", "カタカナ", "한국어", "서울"},
	"ar":    {"مرحبا", "العالم", "كتاب", "مدرسة"},
	"hi":    {"नमस्ते", "दुनिया", "किताब", "भारत"},
	"th":    {"สวัสดี", "ภาษา"},
	"ru":    {"привет", "мир", "Москва", "ЁЖ"},
	"el":    {"γειά", "κόσμος", "Αθήνα"},
	"emoji": {"😀", "👍🏻", "👍🏿", "👩‍🔬", "🏳️‍⚧️", "🇺🇸", "🔥", "✨", "🤖", "🧠", "❤️‍🔥"},
	"num":   {"0", "7", "42", "2024", "3.5", "1,000", "99.99%", "-1", "1e9", "٣", "१०"},
	"punc":  {".", ",", "!", "?", "...", ";", ":", "-", "—", "–", "(", ")", "[", "]", "{", "}", "\"", "'", "«", "»", "“", "”", "#", "@", "&", "*", "/", "\\", "|", "~", "`", "<", ">", "=", "+", "_", "%", "$", "€", "£", "¥"},
	"sp":    {" ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\u00a0", "\u3000", "\u2009", "    "},
	"spec":  {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "[INST]", "[/INST]", "<think>", "</think>", "<tool_call>", "<unk>", "<|fim_pad|>", "<SPECIAL_10>"},
}

var code = []string{
	"def %s(x, y=None):\n    \"\"\"Return the sum.\"\"\"\n    if y is None:\n        return x\n    return x + y  # %s\n",
	"func %s(ctx context.Context, n int) (int, error) {\n\tif n < 0 {\n\t\treturn 0, fmt.Errorf(\"%s: %%d\", n)\n\t}\n\treturn n * 2, nil\n}\n",
	"const %s = async (req, res) => {\n  const { id } = req.params;\n  res.json({ ok: true, msg: `%s ${id}` });\n};\n",
	"fn %s(v: &[u32]) -> Option<u32> {\n    v.iter().copied().max() // %s\n}\n",
	"#include <stdio.h>\nint %s(int argc, char **argv) {\n  printf(\"%s\\n\");\n  return 0;\n}\n",
	"SELECT id, name FROM %s WHERE created_at > '2024-01-01' AND note LIKE '%%%s%%' ORDER BY id DESC;",
	"<div class=\"%s\">\n  <p>%s &amp; more</p>\n</div>",
	"#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"%s $f\" | grep -v %s; done\n",
	"public class %s {\n    public static void main(String[] args) {\n        System.out.println(\"%s\");\n    }\n}\n",
	"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\ndata:\n  key: \"%s\"\n",
}

func corpus(n int) []string {
	r := rand.New(rand.NewPCG(20240601, 7))
	out := append([]string(nil), fixed...)
	// Long words and runs (over 1,000 characters).
	out = append(out,
		strings.Repeat("a", 1500), strings.Repeat("ab", 700), strings.Repeat("9", 1200), strings.Repeat("中", 1100),
		strings.Repeat("🙂", 400), strings.Repeat(" ", 1300), strings.Repeat("\n", 1100), strings.Repeat("!?", 600),
		strings.Repeat("e\u0301", 600), randomLetters(r, 2000), "x"+strings.Repeat(" ", 1200)+"y",
		strings.Repeat("<|im_start|>", 100), strings.Repeat("Hello world. ", 120),
	)
	keys := []string{"en", "fr", "de", "cjk", "ar", "hi", "th", "ru", "el", "emoji", "num", "punc", "sp", "spec"}
	for len(out) < n {
		switch k := r.IntN(10); {
		case k < 2: // code
			tmpl := code[r.IntN(len(code))]
			out = append(out, fmt.Sprintf(tmpl, ident(r), pick(r, words["en"])))
		case k < 3: // chat-formatted
			var b strings.Builder
			for t := 0; t < 1+r.IntN(3); t++ {
				role := []string{"system", "user", "assistant"}[r.IntN(3)]
				fmt.Fprintf(&b, "<|im_start|>%s\n%s<|im_end|>\n", role, sentence(r, keys[:9], 3+r.IntN(12)))
			}
			if r.IntN(2) == 0 {
				b.WriteString("<|im_start|>assistant\n")
			}
			out = append(out, b.String())
		case k < 4: // mistral-style
			out = append(out, fmt.Sprintf("<s>[INST] %s [/INST] %s</s>", sentence(r, keys[:3], 4+r.IntN(8)), sentence(r, keys[:3], 3+r.IntN(8))))
		case k < 5: // random characters from a wide range
			out = append(out, randomRunes(r, 1+r.IntN(40)))
		default: // mixed tokens
			var b strings.Builder
			m := 1 + r.IntN(30)
			for t := 0; t < m; t++ {
				key := keys[r.IntN(len(keys))]
				if key == "spec" && r.IntN(3) > 0 {
					key = "en"
				}
				b.WriteString(pick(r, words[key]))
				if r.IntN(3) > 0 {
					b.WriteString(pick(r, words["sp"][:3]))
				}
			}
			out = append(out, b.String())
		}
	}
	return out[:max(n, len(fixed))]
}

func pick(r *rand.Rand, s []string) string { return s[r.IntN(len(s))] }

func sentence(r *rand.Rand, keys []string, n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = pick(r, words[keys[r.IntN(len(keys))]])
	}
	return strings.Join(parts, " ") + pick(r, []string{".", "!", "?", "", "\n"})
}

func ident(r *rand.Rand) string {
	return pick(r, []string{"get", "set", "load", "parse", "run"}) + pick(r, []string{"User", "Cache", "Token", "_id", "Items", "2"})
}

func randomLetters(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
	}
	return string(b)
}

// randomRunes draws code points from blocks that exercise the classes the
// split patterns use (letters of all cases, marks, digits, spaces, symbols).
func randomRunes(r *rand.Rand, n int) string {
	ranges := [][2]rune{
		{0x20, 0x7e}, {0x09, 0x0d}, {0xa0, 0x17f}, {0x180, 0x24f}, {0x300, 0x36f}, {0x370, 0x3ff}, {0x400, 0x4ff},
		{0x590, 0x5ff}, {0x600, 0x6ff}, {0x900, 0x97f}, {0xe00, 0xe7f}, {0x1e00, 0x1eff}, {0x2000, 0x206f},
		{0x2070, 0x209f}, {0x20a0, 0x20cf}, {0x2100, 0x218f}, {0x2190, 0x23ff}, {0x2460, 0x24ff}, {0x3000, 0x303f},
		{0x3040, 0x30ff}, {0x4e00, 0x4e80}, {0xac00, 0xac80}, {0xfe00, 0xfe0f}, {0xff00, 0xffef}, {0x1f300, 0x1f64f},
		{0x1f900, 0x1f9ff}, {0x1d400, 0x1d4ff},
	}
	var b strings.Builder
	for i := 0; i < n; i++ {
		rg := ranges[r.IntN(len(ranges))]
		c := rg[0] + rune(r.IntN(int(rg[1]-rg[0]+1)))
		if c >= 0xd800 && c <= 0xdfff {
			c = 'x'
		}
		b.WriteRune(c)
	}
	return b.String()
}
