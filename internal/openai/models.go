package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// ModelCard is one entry of GET /v1/models as vLLM writes it: the model's
// id and, when the server says, its context length (vLLM's
// --max-model-len).
type ModelCard struct {
	ID string
	// MaxModelLen is the longest prompt plus answer the server takes, in
	// tokens; 0 when the card does not say.
	MaxModelLen int
}

// MaxModelsBytes bounds the /v1/models body a reader should hand
// ParseModels: a server listing many models with long ids stays far under
// it.
const MaxModelsBytes = 1 << 20

// maxContextLen is the largest max_model_len taken as meant (2^30 tokens;
// the longest contexts served today are a few million).
const maxContextLen = 1 << 30

// ParseModels reads a /v1/models body ({"object":"list","data":[{"id":
// ..., "max_model_len": ...}, ...]}). A max_model_len absent or null is
// 0; one that is not an integer from 1 to 2^30 is an error naming the
// model, as is a body that is not such a list.
func ParseModels(body []byte) ([]ModelCard, error) {
	var list struct {
		Data *[]struct {
			ID          *string          `json:"id"`
			MaxModelLen *json.RawMessage `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("not a model list: %w", err)
	}
	if list.Data == nil {
		return nil, errors.New("not a model list: no data array")
	}
	cards := make([]ModelCard, 0, len(*list.Data))
	for i, d := range *list.Data {
		if d.ID == nil || *d.ID == "" {
			return nil, fmt.Errorf("model list entry %d has no id", i)
		}
		c := ModelCard{ID: *d.ID}
		if d.MaxModelLen != nil && string(*d.MaxModelLen) != "null" {
			var v float64
			if err := json.Unmarshal(*d.MaxModelLen, &v); err != nil || v != math.Trunc(v) || v < 1 || v > maxContextLen {
				return nil, fmt.Errorf("model %.100q: max_model_len %.40s: want an integer from 1 to %d", c.ID, *d.MaxModelLen, maxContextLen)
			}
			c.MaxModelLen = int(v)
		}
		cards = append(cards, c)
	}
	return cards, nil
}

// ServedCard picks the card of the model called name from a server's
// list: the card with that id, else the only card when the server serves
// one model (under another name, its requests for name fail, but its
// context is the server's).
func ServedCard(cards []ModelCard, name string) (ModelCard, bool) {
	for _, c := range cards {
		if c.ID == name {
			return c, true
		}
	}
	if len(cards) == 1 {
		return cards[0], true
	}
	return ModelCard{}, false
}
