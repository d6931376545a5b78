package results

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// WriteJSON writes v to w as JSON indented by two spaces, with a trailing
// newline. HTML characters are not escaped.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// WriteSummaryFile writes s as JSON (see WriteJSON) to the file at path,
// creating or truncating it.
func WriteSummaryFile(path string, s Summary) error {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, s); err != nil {
		return fmt.Errorf("write summary %s: %w", path, err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	return nil
}
