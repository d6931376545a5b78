package tokenize

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/inferrail/inferrail/engine/simtok"
)

// Encoder turns text into token ids and back. *Tokenizer and the built-in
// simulation tokenizer (Load("builtin:sim")) implement it.
type Encoder interface {
	Encode(text string, addSpecialTokens bool) []uint32
	EncodeTo(dst []uint32, text string, addSpecialTokens bool) []uint32
	Decode(ids []uint32, skipSpecial bool) string
}

var (
	_ Encoder = (*Tokenizer)(nil)
	_ Encoder = simEncoder{}
)

// BuiltinSim names the simulation tokenizer (package engine/simtok), which
// maps text to ids deterministically without any file.
const BuiltinSim = "builtin:sim"

// Load returns the Encoder named by spec: "builtin:sim", a directory holding
// tokenizer.json (and tokenizer_config.json), a tokenizer.json path, or a
// Hugging Face model id (ORG/NAME) found in the local Hugging Face cache
// (see HFCacheDir; never downloaded). A path that exists wins over an id.
func Load(spec string) (Encoder, error) {
	if spec == BuiltinSim {
		return simEncoder{simtok.New()}, nil
	}
	spec, st, err := locate(spec)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		if _, err := os.Stat(filepath.Join(spec, "tokenizer.json")); err != nil {
			return nil, fmt.Errorf("tokenizer %q: the directory has no tokenizer.json: %w", spec, err)
		}
		return LoadDir(spec)
	}
	return LoadFile(spec)
}

// simEncoder adapts the simulation tokenizer; it has no special tokens.
type simEncoder struct{ t *simtok.Tokenizer }

func (s simEncoder) Encode(text string, _ bool) []uint32 { return s.t.Encode(text) }

func (s simEncoder) EncodeTo(dst []uint32, text string, _ bool) []uint32 {
	return s.t.AppendEncode(dst, text)
}

func (s simEncoder) Decode(ids []uint32, _ bool) string { return s.t.Decode(ids) }
