package admin

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/eventfeed/subscriptions"
)

// TenantSource is what NewGroupHandler serves: tenants that each run the
// same subscriber names. *subscriptions.Group satisfies it (Tenants,
// Names, Subscriber). The handler asks it anew on every request and every
// sample, so a tenant added to or removed from the group while the handler
// serves appears on, or disappears from, its next page and API answer. Its
// methods must be safe for concurrent use; Subscriber's error for a tenant
// it does not have wraps subscriptions.ErrUnknownTenant (a 404).
type TenantSource interface {
	Tenants() []string
	Names() []string
	Subscriber(tenant, name string) (*subscriptions.Subscriber, error)
}

// TenantAuthorizer is the Authorizer of a handler over tenants
// (NewGroupHandler): it is also told the tenant the request is about.
// subscriber "" is a list: of every tenant's subscribers with tenant ""
// (GET api/subscribers), of one tenant's with tenant T (GET
// api/subscribers?tenant=T, asked once per tenant named). Everything else
// Authorizer says holds, per (tenant, subscriber) pair.
type TenantAuthorizer func(r *http.Request, action Action, tenant, subscriber string) (caller string, allowed bool)

// NewGroupHandler is NewHandler over the tenants of group (a
// *subscriptions.Group): a row per tenant and subscriber name, each
// showing its tenant, the page and the list filtered by tenant
// (?tenant=T, a filter box on the page), and every route about one
// subscriber addressing it by name and ?tenant=T (forms: a tenant field),
// acting on group.Subscriber(T, name); without a tenant such a request is
// answered 400, for an unknown one 404. The authorizer is asked with the
// tenant, and audit lines and refusals carry it (tenant=T). Tenants come
// and go while it serves (see TenantSource). Rows are ordered by tenant,
// then by the group's order of names.
//
// Each row's status is read per request and per sample as NewHandler's
// are: a page or list of every tenant costs one Subscriber.Status per
// tenant and name, read one after another, and so does every sample of
// the charts (choose WithSampleInterval for that many rows: a round that
// outlasts the interval delays the next). It returns an error for a nil
// group or authorizer, or an option out of its range; a group without a
// tenant yet is served, empty.
func NewGroupHandler(group TenantSource, authorize TenantAuthorizer, opts ...Option) (*Handler, error) {
	if group == nil {
		return nil, errors.New("admin: NewGroupHandler: group: nil")
	}
	if authorize == nil {
		return nil, errors.New("admin: NewGroupHandler: authorize: nil authorizer (the handler never serves without one)")
	}
	return newHandler("NewGroupHandler", groupSource{group}, authorize, opts)
}

// key names one row of a handler: a subscriber, and its tenant ("" for
// NewHandler's).
type key struct{ tenant, name string }

// logAttrs are the attributes naming k in log lines: the subscriber, and
// the tenant when there is one.
func (k key) logAttrs() []any {
	if k.tenant == "" {
		return []any{"subscriber", k.name}
	}
	return []any{"subscriber", k.name, "tenant", k.tenant}
}

// source is the rows a handler serves: a fixed list (NewHandler) or a
// group's tenants (NewGroupHandler). Safe for concurrent use.
type source interface {
	// keys returns the rows, in the page's order.
	keys() []key
	// lookup returns k's subscriber, or the refusal of a request about it
	// (an unknown subscriber or tenant, a missing tenant).
	lookup(k key) (*subscriptions.Subscriber, *refusal)
	// hasTenant reports whether tenant is one of the source's (for the
	// filters); tenants reports whether rows have tenants at all.
	hasTenant(tenant string) bool
	tenants() bool
}

// fixedSource is NewHandler's: the subscribers it was given, by name.
type fixedSource struct {
	subs  map[string]*subscriptions.Subscriber
	names []string // sorted
}

func (f fixedSource) keys() []key {
	out := make([]key, len(f.names))
	for i, n := range f.names {
		out[i] = key{name: n}
	}
	return out
}

func (f fixedSource) lookup(k key) (*subscriptions.Subscriber, *refusal) {
	if k.tenant != "" {
		return nil, unknownTenant(k.tenant)
	}
	s, ok := f.subs[k.name]
	if !ok {
		return nil, &refusal{http.StatusNotFound, "unknown subscriber " + strconv.Quote(k.name)}
	}
	return s, nil
}

func (fixedSource) hasTenant(tenant string) bool { return tenant == "" }
func (fixedSource) tenants() bool                { return false }

// groupSource is NewGroupHandler's: the group's tenants and names as they
// are at each call.
type groupSource struct{ g TenantSource }

func (s groupSource) keys() []key {
	tenants := slices.Sorted(slices.Values(s.g.Tenants()))
	names := s.g.Names()
	out := make([]key, 0, len(tenants)*len(names))
	for _, t := range tenants {
		for _, n := range names {
			out = append(out, key{t, n})
		}
	}
	return out
}

func (s groupSource) lookup(k key) (*subscriptions.Subscriber, *refusal) {
	if k.tenant == "" {
		return nil, &refusal{http.StatusBadRequest, "tenant: required: this handler serves the tenants of a group (?tenant=T)"}
	}
	if !slices.Contains(s.g.Names(), k.name) {
		return nil, &refusal{http.StatusNotFound, "unknown subscriber " + strconv.Quote(k.name)}
	}
	sub, err := s.g.Subscriber(k.tenant, k.name)
	switch {
	case errors.Is(err, subscriptions.ErrUnknownTenant):
		return nil, unknownTenant(k.tenant)
	case err != nil:
		return nil, &refusal{http.StatusInternalServerError, fmt.Sprintf("tenant %q, subscriber %q: %v", k.tenant, k.name, err)}
	}
	return sub, nil
}

func (s groupSource) hasTenant(tenant string) bool { return slices.Contains(s.g.Tenants(), tenant) }
func (groupSource) tenants() bool                  { return true }

func unknownTenant(tenant string) *refusal {
	return &refusal{http.StatusNotFound, "unknown tenant " + strconv.Quote(tenant)}
}

// filterKeys returns the rows of tenants (every row when none is given),
// or the refusal of the first tenant the source does not have.
func (h *Handler) filterKeys(tenants []string) ([]key, *refusal) {
	all := h.src.keys()
	if len(tenants) == 0 {
		return all, nil
	}
	for _, t := range tenants {
		if !h.src.hasTenant(t) {
			return nil, unknownTenant(t)
		}
	}
	out := all[:0:0]
	for _, k := range all {
		if slices.Contains(tenants, k.tenant) {
			out = append(out, k)
		}
	}
	return out, nil
}
