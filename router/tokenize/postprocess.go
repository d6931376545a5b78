package tokenize

import (
	"encoding/json"
	"fmt"
)

// affix is what a post-processor adds around a single sequence's ids when
// special tokens are asked for.
type affix struct{ prefix, suffix []uint32 }

// wrap applies an outer post-processor after an inner one.
func (a affix) wrap(outer affix) affix {
	return affix{
		prefix: append(append([]uint32(nil), outer.prefix...), a.prefix...),
		suffix: append(append([]uint32(nil), a.suffix...), outer.suffix...),
	}
}

func parsePostProcessor(m json.RawMessage) (affix, error) {
	if isNull(m) {
		return affix{}, nil
	}
	typ, err := componentType(m)
	if err != nil {
		return affix{}, fmt.Errorf("post_processor: %w", err)
	}
	switch typ {
	case "ByteLevel":
		return affix{}, nil // only adjusts offsets
	case "Sequence":
		var s struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(m, &s); err != nil {
			return affix{}, fmt.Errorf("post_processor Sequence: %w", err)
		}
		var acc affix
		for _, c := range s.Processors {
			p, err := parsePostProcessor(c)
			if err != nil {
				return affix{}, err
			}
			acc = acc.wrap(p)
		}
		return acc, nil
	case "TemplateProcessing":
		return parseTemplate(m)
	case "RobertaProcessing", "BertProcessing":
		var r struct {
			Sep [2]json.RawMessage `json:"sep"`
			Cls [2]json.RawMessage `json:"cls"`
		}
		if err := json.Unmarshal(m, &r); err != nil {
			return affix{}, fmt.Errorf("post_processor %s: %w", typ, err)
		}
		var sep, cls uint32
		if err := json.Unmarshal(r.Sep[1], &sep); err != nil {
			return affix{}, fmt.Errorf("post_processor %s: sep: %w", typ, err)
		}
		if err := json.Unmarshal(r.Cls[1], &cls); err != nil {
			return affix{}, fmt.Errorf("post_processor %s: cls: %w", typ, err)
		}
		return affix{prefix: []uint32{cls}, suffix: []uint32{sep}}, nil
	}
	return affix{}, unsupported("post_processor", typ, "TemplateProcessing", "ByteLevel", "RobertaProcessing", "BertProcessing", "Sequence")
}

func parseTemplate(m json.RawMessage) (affix, error) {
	var t struct {
		Single []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(m, &t); err != nil {
		return affix{}, fmt.Errorf("post_processor TemplateProcessing: %w", err)
	}
	var a affix
	seen := false
	for _, p := range t.Single {
		switch {
		case p.Sequence != nil:
			if seen || p.Sequence.ID != "A" {
				return affix{}, fmt.Errorf("post_processor TemplateProcessing: the single template must hold $A exactly once")
			}
			seen = true
		case p.SpecialToken != nil:
			st, ok := t.SpecialTokens[p.SpecialToken.ID]
			if !ok {
				return affix{}, fmt.Errorf("post_processor TemplateProcessing: special token %q is missing from special_tokens", p.SpecialToken.ID)
			}
			if seen {
				a.suffix = append(a.suffix, st.IDs...)
			} else {
				a.prefix = append(a.prefix, st.IDs...)
			}
		default:
			return affix{}, fmt.Errorf("post_processor TemplateProcessing: a single template piece must be SpecialToken or Sequence")
		}
	}
	if !seen {
		return affix{}, fmt.Errorf("post_processor TemplateProcessing: the single template must hold $A exactly once")
	}
	return a, nil
}
