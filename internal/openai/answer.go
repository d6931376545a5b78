package openai

// Answer gathers what a whole response said, event by event: what the
// proxy learns from each answer it relays (its length from the usage, its
// text for the KV index, whether it ended well).
//
// The zero Answer keeps all the text; Reset readies it for the next
// response, keeping its buffer.
type Answer struct {
	// MaxText bounds the text kept, in bytes; 0 keeps all of it, a
	// negative MaxText none (only the counts are wanted). Beyond it the
	// text is dropped and Truncated set.
	MaxText int

	// Text is the generated text (Event.Text) of every chunk of the first
	// choice (index 0), concatenated: the answer a conversation goes on
	// from when n > 1 (the other choices' chunks are counted, not kept);
	// reasoning is not part of it.
	Text      []byte
	Truncated bool
	// Generated counts the chunks that carried generated text, visible or
	// reasoning (one token each, unless the server batched tokens).
	Generated int
	// Usage is the last usage seen, when HasUsage.
	Usage    Usage
	HasUsage bool
	// FinishReason is the last finish reason seen.
	FinishReason string
	// Done reports that the stream's last event was seen: data: [DONE],
	// or a Responses API stream's response.completed or
	// response.incomplete.
	Done bool
	// ResponseID is the Responses API response's id, when an event
	// carried it.
	ResponseID []byte
	// Error is the first error event's error, if any.
	Error *ErrorInfo
	// Events counts the events.
	Events int
}

// Reset readies a for another response, keeping MaxText and Text's buffer.
func (a *Answer) Reset() {
	*a = Answer{MaxText: a.MaxText, Text: a.Text[:0], ResponseID: a.ResponseID[:0]}
}

// Add takes the next events of the response.
func (a *Answer) Add(events ...Event) {
	for i := range events {
		e := &events[i]
		a.Events++
		switch e.Kind {
		case KindDone:
			a.Done = true
		case KindError:
			if a.Error == nil {
				a.Error = e.Error
			}
		}
		if e.Generated() {
			a.Generated++
		}
		if len(e.Text) > 0 && e.Index == 0 && !a.Truncated && a.MaxText >= 0 {
			if a.MaxText > 0 && len(a.Text)+len(e.Text) > a.MaxText {
				a.Truncated = true
			} else {
				a.Text = append(a.Text, e.Text...)
			}
		}
		if e.FinishReason != "" {
			a.FinishReason = e.FinishReason
		}
		if e.HasUsage {
			a.Usage, a.HasUsage = e.Usage, true
		}
		if len(e.ResponseID) > 0 && len(a.ResponseID) == 0 {
			a.ResponseID = append(a.ResponseID, e.ResponseID...)
		}
	}
}
