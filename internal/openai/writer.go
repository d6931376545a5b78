package openai

import (
	"strconv"
	"unicode/utf16"
)

// AppendErrorEvent appends to dst what vLLM writes into a stream that
// fails after its start, byte for byte: the error event, whose data is
// Python's json.dumps of its ErrorResponse ({"error": {"message": ...,
// "type": ..., "param": null, "code": ...}}, with ", " and ": " between
// items and every character outside printable ASCII escaped), then the
// "data: [DONE]" vLLM still sends after it (completion/serving.py and
// chat_completion/serving.py, completion_stream_generator: the except
// branches yield the error, then the generator ends with [DONE]).
//
// vLLM calls a failure during generation type "InternalServerError", code
// 500; a proxy that relays a stream and then loses its engine can write
// the same, then abort the connection so that clients that ignore error
// events still see the response fail.
func AppendErrorEvent(dst []byte, message, typ string, code int) []byte {
	return AppendDone(AppendError(dst, message, typ, code))
}

// AppendError appends the error event of AppendErrorEvent alone, without
// the data: [DONE] after it: for a proxy that aborts the response next, so
// that no client reads the stream as one that ended.
func AppendError(dst []byte, message, typ string, code int) []byte {
	dst = append(dst, `data: {"error": {"message": `...)
	dst = appendPyString(dst, message)
	dst = append(dst, `, "type": `...)
	dst = appendPyString(dst, typ)
	dst = append(dst, `, "param": null, "code": `...)
	dst = strconv.AppendInt(dst, int64(code), 10)
	return append(dst, "}}\n\n"...)
}

// AppendResponsesError appends the error event of a Responses API stream
// (/v1/responses), as OpenAI's API writes one: "event: error" and data
// {"type": "error", "code": ..., "message": ..., "param": null,
// "sequence_number": ...}, seq being the number of the events before it
// (they count from 0). Such streams end with no data: [DONE].
func AppendResponsesError(dst []byte, message, code string, seq int) []byte {
	dst = append(dst, "event: error\ndata: {\"type\": \"error\", \"code\": "...)
	dst = appendPyString(dst, code)
	dst = append(dst, `, "message": `...)
	dst = appendPyString(dst, message)
	dst = append(dst, `, "param": null, "sequence_number": `...)
	dst = strconv.AppendInt(dst, int64(seq), 10)
	return append(dst, "}\n\n"...)
}

// AppendDone appends the event that ends a stream, "data: [DONE]".
func AppendDone(dst []byte) []byte { return append(dst, "data: [DONE]\n\n"...) }

// appendPyString appends s as Python's json.dumps writes a str with its
// default ensure_ascii: \" \\ \b \f \n \r \t, \u00XX for other bytes
// outside ' '..'~', and \uXXXX (surrogate pairs beyond the BMP, lower-case
// hex) for the rest. Invalid UTF-8, which a Python str cannot hold, is
// written as U+FFFD.
func appendPyString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	u := func(dst []byte, r rune) []byte {
		return append(dst, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
	}
	dst = append(dst, '"')
	for _, r := range s { // invalid UTF-8 ranges as utf8.RuneError
		switch {
		case r == '"':
			dst = append(dst, '\\', '"')
		case r == '\\':
			dst = append(dst, '\\', '\\')
		case r == '\b':
			dst = append(dst, '\\', 'b')
		case r == '\f':
			dst = append(dst, '\\', 'f')
		case r == '\n':
			dst = append(dst, '\\', 'n')
		case r == '\r':
			dst = append(dst, '\\', 'r')
		case r == '\t':
			dst = append(dst, '\\', 't')
		case r >= ' ' && r <= '~':
			dst = append(dst, byte(r))
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			dst = u(u(dst, r1), r2)
		default:
			dst = u(dst, r)
		}
	}
	return append(dst, '"')
}
