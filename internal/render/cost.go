package render

import (
	"slices"
	"strings"

	"github.com/slidegate/slidegate/api/v1alpha1"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// DefaultRequestCost is the cost of a request whose cost header is
// missing or not a whole number, when the policy does not say
// (spec.cost.request.default).
const DefaultRequestCost = 1

// cost renders spec.cost (issue 27) for either document, with the API's
// defaults written out (the documents' fields are literal): a header's
// default is 1 unless the policy says, a response's 0 (rendered as
// absent). Nothing is dropped: a part the document cannot carry (a header
// for the rate limit service, a default beside a constant) stays, and the
// document's Validate refuses it with what is wrong.
func cost(c *v1alpha1.Cost) *sidecarconfig.Cost {
	if c == nil {
		return nil
	}
	out := &sidecarconfig.Cost{}
	if r := c.Request; r != nil {
		out.Request = &sidecarconfig.RequestCost{Constant: clonePtr(r.Constant), Header: string(r.Header), Default: clonePtr(r.Default)}
		if r.Header != "" && r.Default == nil {
			d := int64(DefaultRequestCost)
			out.Request.Default = &d
		}
	}
	if r := c.Response; r != nil {
		out.Response = &sidecarconfig.ResponseCost{Header: string(r.Header)}
		for _, f := range r.JSONFields {
			// Alternatives ("a|b": the one seen last counts) in one order.
			alts := strings.Split(string(f), "|")
			slices.Sort(alts)
			out.Response.JSONFields = append(out.Response.JSONFields, strings.Join(alts, "|"))
		}
		// The cost is a sum: order does not matter, and an entry listed
		// twice (which the schema refuses) would count twice.
		slices.Sort(out.Response.JSONFields)
		out.Response.JSONFields = slices.Compact(out.Response.JSONFields)
		if r.Default != nil {
			out.Response.Default = *r.Default
		}
	}
	return out
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
