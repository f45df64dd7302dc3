package admin

import (
	_ "embed"
	"encoding/json"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/eventfeed/subscriptions"
)

//go:embed page.html
var pageHTML string

func parsePage() (*template.Template, error) {
	return template.New("admin").Funcs(template.FuncMap{
		"seconds": formatSeconds,
		"when":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
		// query is a link's query string; empty values are left out (a
		// row without a tenant).
		"query": func(kv ...string) string {
			v := url.Values{}
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i+1] != "" {
					v.Set(kv[i], kv[i+1])
				}
			}
			return "?" + v.Encode()
		},
	}).Parse(pageHTML)
}

// pageData is what the page template renders.
type pageData struct {
	Caller      string
	Token       string
	Subscribers []statusRow
	// SampleEvery is the sampler's interval and ChartSpan how far back the
	// charts go ("" for a single sample), for the charts' legend.
	SampleEvery time.Duration
	ChartSpan   string
	// Tenants is whether rows have tenants (NewGroupHandler: the tenant
	// column and filter); Tenant is the filter, "" for every tenant.
	Tenants        bool
	Tenant         string
	Selected       string
	SelectedTenant string
	Parked         *subscriptions.ParkedPage
	ParkedError    string
	Detail         *parkedDetail
	Payload        string
	Notice         string
	Failure        string
}

// notices are the fixed messages a redirect after an action may
// show (the query names one; no text from the URL is echoed).
var notices = map[string]string{
	"replayed":  "Replayed: the event is no longer parked.",
	"discarded": "Discarded: the event was removed from the parking lot (audit-logged).",
	"paused":    "Paused everywhere: no replica or partition handles anything from its next batch until Resume.",
	"resumed":   "Resumed: every replica goes on from its checkpoint at its next poll.",
}

// servePage serves the page. With ?subscriber=NAME (and, for a group's,
// &tenant=T) the caller must be allowed to read that subscriber; without,
// to read at least one subscriber (of ?tenant=T alone, the tenant filter)
// (an unauthenticated caller is answered 401, a caller who may read none
// 403). Either way renderPage shows only the subscribers the caller may
// read.
func (h *Handler) servePage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var caller string
	var ref *refusal
	if name := q.Get("subscriber"); name != "" {
		caller, ref = h.authorize(r, Read, key{q.Get("tenant"), name})
	} else {
		caller, ref = h.authorizeAnyRead(r, q.Get("tenant"))
	}
	if ref != nil {
		http.Error(w, ref.reason, ref.status)
		return
	}
	h.renderPage(w, r, caller, http.StatusOK, notices[q.Get("done")], "")
}

// authorizeAnyRead authorizes the page without a selected subscriber: the
// caller may read at least one subscriber (of tenant, when it is not "").
// The authorizer is asked per subscriber, not about "" as the API's list
// does, so that a caller allowed to read some subscribers only gets a page
// of those instead of a refusal. A tenant the source does not have is
// asked about as a list (tenant, ""), so that the page can tell an
// allowed caller it is unknown.
func (h *Handler) authorizeAnyRead(r *http.Request, tenant string) (string, *refusal) {
	var tenants []string
	if tenant != "" {
		tenants = []string{tenant}
	}
	keys, unknown := h.filterKeys(tenants)
	if unknown != nil {
		return h.authorize(r, Read, key{tenant: tenant})
	}
	var caller string
	for _, k := range keys {
		c, ok := h.auth(r, Read, k.tenant, k.name)
		if ok {
			return c, nil
		}
		if caller == "" {
			caller = c
		}
	}
	if caller == "" && len(keys) == 0 {
		// No row to ask about (a group without tenants yet): whether the
		// caller may read the list.
		return h.authorize(r, Read, key{tenant: tenant})
	}
	ref := &refusal{status: http.StatusForbidden, reason: "not allowed to read any subscriber"}
	if caller == "" {
		ref = &refusal{status: http.StatusUnauthorized, reason: "not authenticated"}
	}
	h.logRefusal(r, caller, Read, key{tenant: tenant}, ref)
	return caller, ref
}

// readable reports whether the request's caller may read k's subscriber:
// the page asks it for every subscriber it renders, whichever request (a
// GET, or the re-render after a failed form) got it there. A "no" hides
// the subscriber and is not a refused request, so it is not logged.
func (h *Handler) readable(r *http.Request, k key) bool {
	_, ok := h.auth(r, Read, k.tenant, k.name)
	return ok
}

// renderPage renders the page for the request's query (tenant filter,
// selected subscriber, after cursor, shown event) with a notice or a
// failure. It renders only what the caller may read: the rows of the
// subscribers the authorizer allows Read on, and the selected
// subscriber's parked events only if it is one of them, so no path to the
// page (a GET, or a form's re-render, which was authorized for its action
// only) shows another subscriber's status, error or lag.
func (h *Handler) renderPage(w http.ResponseWriter, r *http.Request, caller string, status int, notice, failure string) {
	ctx := r.Context()
	q := r.URL.Query()
	if r.Method == http.MethodPost {
		q = url.Values{"subscriber": {r.PostFormValue("subscriber")}, "tenant": {r.PostFormValue("tenant")}}
	}
	tenant := q.Get("tenant")
	d := pageData{Caller: caller, Token: h.csrfToken(caller), SampleEvery: h.cfg.sampleEvery, Notice: notice, Failure: failure,
		Tenants: h.src.tenants(), Tenant: tenant}
	var tenants []string
	if tenant != "" {
		tenants = []string{tenant}
	}
	keys, ref := h.filterKeys(tenants)
	if ref != nil {
		status, d.Failure = ref.status, "Unknown tenant "+tenant+"."
	}
	now := h.cfg.clock.Now()
	d.ChartSpan = h.chartSpan(now)
	for _, k := range keys {
		s, ref := h.src.lookup(k)
		if ref != nil || !h.readable(r, k) {
			continue // removed since keys, or not the caller's to read
		}
		row := readStatus(ctx, target{k, s})
		row.Charts = buildCharts(h.history.samples(k, now), now)
		d.Subscribers = append(d.Subscribers, row)
	}
	if name := q.Get("subscriber"); name != "" && ref == nil {
		k := key{tenant, name}
		s, ref := h.src.lookup(k)
		switch {
		case ref != nil:
			status, d.Failure = ref.status, pageFailure(ref)
		case !h.readable(r, k):
			// A form's action was allowed but reading is not: the
			// outcome is shown, the subscriber's parked events are not.
		default:
			d.Selected, d.SelectedTenant = name, tenant
			f, err := parkedFilter(r)
			if err == nil {
				var page subscriptions.ParkedPage
				if page, err = s.ListParkedPage(ctx, f); err == nil {
					d.Parked = &page
				}
			}
			if err != nil {
				d.ParkedError = err.Error()
			}
			if id := q.Get("event"); id != "" {
				det, err := h.detail(ctx, s, id)
				if err != nil {
					d.ParkedError = err.Error()
				} else {
					d.Detail = &det
					if det.Event != nil {
						b, _ := json.MarshalIndent(det.Event.Payload, "", "  ")
						d.Payload = string(b)
					}
				}
			}
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	w.WriteHeader(status)
	if err := h.page.Execute(w, d); err != nil {
		h.cfg.logger.Error("admin page: render failed", "error", err)
	}
}

// pageFailure is the page's sentence for a lookup's refusal.
func pageFailure(ref *refusal) string {
	r := []rune(ref.reason)
	if len(r) == 0 {
		return ""
	}
	return strings.ToUpper(string(r[0])) + string(r[1:]) + "."
}

// uiAction serves the page's replay, discard, pause and resume forms:
// authorization, the cross-site checks and the anti-CSRF token, then
// Post/Redirect/Get on success, or the page with the failure (and its
// status) otherwise.
func (h *Handler) uiAction(action Action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		k, id := key{r.PostFormValue("tenant"), r.PostFormValue("subscriber")}, r.PostFormValue("event_id")
		caller, ref := h.authorize(r, action, k)
		if ref == nil {
			if ref = h.sameOrigin(r); ref == nil && !h.validToken(caller, r.PostFormValue("csrf")) {
				ref = &refusal{http.StatusForbidden, "missing or invalid anti-CSRF token (reload the page)"}
			}
			if ref != nil {
				h.logRefusal(r, caller, action, k, ref)
			}
		}
		if ref != nil {
			http.Error(w, ref.reason, ref.status)
			return
		}
		s, ref := h.src.lookup(k)
		if ref != nil {
			h.renderPage(w, r, caller, ref.status, "", pageFailure(ref))
			return
		}
		t := target{k, s}
		var err error
		status := http.StatusOK
		switch action {
		case Replay:
			status, err = h.replayOne(r, t, caller, id)
		case Discard:
			// The form's checkbox is required by the browser; a request
			// without it (a misfired script, an old page) changes nothing.
			if r.PostFormValue("confirm") != "yes" {
				h.renderPage(w, r, caller, http.StatusBadRequest, "", "Not discarded: tick \"sure\" next to Discard to confirm.")
				return
			}
			var p subscriptions.ParkedEvent
			p, err = s.DiscardParked(r.Context(), id, caller)
			h.audit(r, caller, Discard, k, err, "event_id", id, "event_type", p.EventType, "position", p.Position, "parked_error", p.Error)
			if err != nil {
				status = errorStatus(err, false)
			}
		case Pause:
			// As a discard's: the pause stops the name in every process.
			if r.PostFormValue("confirm") != "yes" {
				h.renderPage(w, r, caller, http.StatusBadRequest, "", "Not paused: tick \"sure\" next to Pause to confirm.")
				return
			}
			_, status, err = h.setPaused(r, t, caller, true, r.PostFormValue("reason"))
		case Resume:
			_, status, err = h.setPaused(r, t, caller, false, "")
		}
		if err != nil {
			h.renderPage(w, r, caller, status, "", err.Error())
			return
		}
		done := map[Action]string{Replay: "replayed", Discard: "discarded", Pause: "paused", Resume: "resumed"}[action]
		// Relative on purpose: http.Redirect would resolve it against the
		// path below the mount prefix.
		back := url.Values{"subscriber": {k.name}, "done": {done}}
		if k.tenant != "" {
			back.Set("tenant", k.tenant)
		}
		w.Header().Set("Location", "../?"+back.Encode())
		w.WriteHeader(http.StatusSeeOther)
	}
}
