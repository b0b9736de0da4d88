// Package respcost measures what a response costs when the cost is known
// only from the response itself: a header or trailer, or fields of a JSON
// body, such as a model server's usage.total_tokens, including the usage
// objects of a Server-Sent Events stream.
//
// The model: a policy's Spec is compiled once into a Rule; each response's
// body is wrapped in a Meter (Rule.NewMeter), which the proxy reads instead
// of the body. Read hands the upstream's bytes through unchanged and at
// once — nothing is held back, so streaming stays streaming — and parses
// them as they go by. When the response has ended, the caller calls Cost
// with the trailers, and charges the Result.
//
// What is parsed. By Content-Type: application/json and any +json type as
// one JSON document; text/event-stream as events, each event's data as one
// JSON document (OpenAI streams put usage in the last data chunk when
// stream_options.include_usage is set; Anthropic streams put
// message.usage.input_tokens in message_start and a cumulative
// usage.output_tokens in message_delta). Anything else, and any body with a
// Content-Encoding (gzip, br: not decoded, IssueEncoded), is passed through
// unparsed: only the header, trailer or Default can then give the cost. A
// field's value counts if it is a whole number written in plain digits;
// negative, fractional or exponent numbers, strings and booleans are
// ignored as if absent (IssueIgnoredValue), and a value above MaxCost counts
// as MaxCost (Clamped). For each field the last value seen wins, since
// streams report cumulative totals; the cost is the sum of the fields. A
// field may name alternative paths ("usage.input_tokens|
// message.usage.input_tokens"), for servers that report one number in
// several places. Paths go through objects only: a usage object inside an
// array (a tool call's arguments, say) is not the response's usage.
//
// Where the cost comes from, in order: the header, the trailer, the body's
// fields (if any was found), Default. Default is also the cost of a
// response that says nothing, e.g. an upstream that omits usage or an error
// page.
//
// Bounded work whatever the upstream sends. A Meter is one allocation of
// fixed size; Read allocates nothing and buffers nothing: keys are matched
// against the paths byte by byte, numbers are accumulated digit by digit,
// strings are skipped with bytes.IndexByte, and a value no path leads into
// (any array, an object under a key no path names) is skipped by counting
// brackets, so nesting of any depth costs one counter. A JSON body of any
// size (an embeddings response of many megabytes with usage at its end) is
// parsed whole, in time linear in its length. Caps bound the rest:
// MaxNumberBytes per number, MaxEventBytes of data per event, and the
// Spec's own (MaxFields, MaxPaths, MaxPathSegments, MaxFieldBytes). Bytes
// beyond a cap are passed through untouched but not parsed, and the Result
// says so (IssueOverCap): the cost is what was found elsewhere, else
// Default.
//
// Disconnects. If the client goes away mid-stream (or the upstream breaks
// off), the caller stops reading and calls Cost all the same: the Result is
// what had been read (IssueCut). For an OpenAI-style stream that is usually
// Default, since usage comes last; for an Anthropic stream, the input
// tokens and the output tokens reported so far. An SSE event counts once its
// data is a whole JSON object, even if the blank line that ends it never
// came.
package respcost
