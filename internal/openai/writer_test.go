package openai

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// The bytes vLLM writes (Python's json.dumps of its ErrorResponse), as
// python3 printed them for this message.
func TestAppendErrorEventMatchesPython(t *testing.T) {
	msg := "a \"quoted\" \\ back\nslash\t tab \x01 ctrl \x7f del \u00e9 \U0001F600 \u2028 / end\r\b\f"
	want := `data: {"error": {"message": "a \"quoted\" \\ back\nslash\t tab \u0001 ctrl \u007f del \u00e9 \ud83d\ude00 \u2028 / end\r\b\f", "type": "InternalServerError", "param": null, "code": 500}}` + "\n\ndata: [DONE]\n\n"
	if got := string(AppendErrorEvent(nil, msg, "InternalServerError", 500)); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// The error event is what testdata/vllm-error.sse ends with, and reads
// back as an error then [DONE].
func TestAppendErrorEventGolden(t *testing.T) {
	b := AppendErrorEvent([]byte("prefix "), "Internal server error", "InternalServerError", 500)
	golden(t, filepath.Join("testdata", "error-event.golden"), string(b))
	stream, err := os.ReadFile(filepath.Join("testdata", "vllm-error.sse"))
	if err != nil {
		t.Fatal(err)
	}
	if tail := b[len("prefix "):]; len(stream) < len(tail) || string(stream[len(stream)-len(tail):]) != string(tail) {
		t.Errorf("vllm-error.sse does not end with the event written:\n%s", tail)
	}
	evs, err := readAll(b[len("prefix "):], 3)
	if err != nil || len(evs) != 2 || evs[0].Kind != KindError || evs[1].Kind != KindDone {
		t.Fatalf("read back: %s", render(evs, err))
	}
	if n, ok := evs[0].Error.Code.Number(); !ok || n != 500 || evs[0].Error.Type != "InternalServerError" || evs[0].Error.Param != nil {
		t.Errorf("read back %+v", evs[0].Error)
	}
	// Invalid UTF-8 is written as U+FFFD, as a Python str would hold it.
	evs, err = readAll(AppendErrorEvent(nil, "bad \xff", "t", 1))
	if err != nil || evs[0].Error.Message != "bad \uFFFD" {
		t.Errorf("invalid UTF-8: %s", render(evs, err))
	}
}

func TestErrorBodyJSON(t *testing.T) {
	for _, c := range []struct {
		body ErrorBody
		want string
	}{
		{ErrorBody{Error: ErrorInfo{Message: "queue full", Type: "rate_limit_exceeded", Code: StringCode("queue_full")}},
			`{"error":{"message":"queue full","type":"rate_limit_exceeded","param":null,"code":"queue_full"}}`},
		{ErrorBody{Error: ErrorInfo{Message: "m", Type: "BadRequestError", Code: NumberCode(400)}},
			`{"error":{"message":"m","type":"BadRequestError","param":null,"code":400}}`},
		{ErrorBody{}, `{"error":{"message":"","type":"","param":null,"code":null}}`},
	} {
		b, err := json.Marshal(c.body)
		if err != nil || string(b) != c.want {
			t.Errorf("%s, %v; want %s", b, err, c.want)
		}
		var back ErrorBody
		if err := json.Unmarshal(b, &back); err != nil || back.Error.Code.String() != c.body.Error.Code.String() || back.Error.Message != c.body.Error.Message {
			t.Errorf("%s: read back %+v, %v", b, back, err)
		}
		e, err := ParseResponse(b)
		if err != nil || e.Kind != KindError || e.Error.Code.String() != c.body.Error.Code.String() {
			t.Errorf("%s: ParseResponse %+v, %v", b, e, err)
		}
	}
}
