package admin

import (
	_ "embed"
	"encoding/json"
	"html/template"
	"net/http"
	"net/url"
	"time"

	"github.com/eventfeed/subscriptions"
)

//go:embed page.html
var pageHTML string

func parsePage() (*template.Template, error) {
	return template.New("admin").Funcs(template.FuncMap{
		"seconds": formatSeconds,
		"when":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
		"query": func(kv ...string) string {
			v := url.Values{}
			for i := 0; i+1 < len(kv); i += 2 {
				v.Set(kv[i], kv[i+1])
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
	Selected    string
	Parked      *subscriptions.ParkedPage
	ParkedError string
	Detail      *parkedDetail
	Payload     string
	Notice      string
	Failure     string
}

// notices are the fixed messages a redirect after an action may
// show (the query names one; no text from the URL is echoed).
var notices = map[string]string{
	"replayed":  "Replayed: the event is no longer parked.",
	"discarded": "Discarded: the event was removed from the parking lot (audit-logged).",
	"paused":    "Paused everywhere: no replica or partition handles anything from its next batch until Resume.",
	"resumed":   "Resumed: every replica goes on from its checkpoint at its next poll.",
}

// servePage serves the page. With ?subscriber=NAME the caller must be
// allowed to read NAME; without, to read at least one subscriber (an
// unauthenticated caller is answered 401, a caller who may read none 403).
// Either way renderPage shows only the subscribers the caller may read.
func (h *Handler) servePage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var caller string
	var ref *refusal
	if name := q.Get("subscriber"); name != "" {
		caller, ref = h.authorize(r, Read, name)
	} else {
		caller, ref = h.authorizeAnyRead(r)
	}
	if ref != nil {
		http.Error(w, ref.reason, ref.status)
		return
	}
	h.renderPage(w, r, caller, http.StatusOK, notices[q.Get("done")], "")
}

// authorizeAnyRead authorizes the page without a selected subscriber: the
// caller may read at least one subscriber. The authorizer is asked per
// subscriber, not about "" as the API's list does, so that a caller
// allowed to read some subscribers only gets a page of those instead of a
// refusal.
func (h *Handler) authorizeAnyRead(r *http.Request) (string, *refusal) {
	var caller string
	for _, name := range h.names {
		c, ok := h.auth(r, Read, name)
		if ok {
			return c, nil
		}
		if caller == "" {
			caller = c
		}
	}
	ref := &refusal{status: http.StatusForbidden, reason: "not allowed to read any subscriber"}
	if caller == "" {
		ref = &refusal{status: http.StatusUnauthorized, reason: "not authenticated"}
	}
	h.cfg.logger.Warn("admin request refused", "reason", ref.reason, "action", string(Read), "caller", caller,
		"subscriber", "", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
	return caller, ref
}

// readable reports whether the request's caller may read subscriber: the
// page asks it for every subscriber it renders, whichever request (a GET,
// or the re-render after a failed form) got it there. A "no" hides the
// subscriber and is not a refused request, so it is not logged.
func (h *Handler) readable(r *http.Request, subscriber string) bool {
	_, ok := h.auth(r, Read, subscriber)
	return ok
}

// renderPage renders the page for the request's query (selected
// subscriber, after cursor, shown event) with a notice or a failure. It
// renders only what the caller may read: the rows of the subscribers the
// authorizer allows Read on, and the selected subscriber's parked
// events only if it is one of them, so no path to the page (a GET, or a
// form's re-render, which was authorized for its action only) shows
// another subscriber's status, error or lag.
func (h *Handler) renderPage(w http.ResponseWriter, r *http.Request, caller string, status int, notice, failure string) {
	ctx := r.Context()
	q := r.URL.Query()
	if r.Method == http.MethodPost {
		q = url.Values{"subscriber": {r.PostFormValue("subscriber")}}
	}
	var subs []statusRow
	now := h.cfg.clock.Now()
	for _, name := range h.names {
		if h.readable(r, name) {
			row := readStatus(ctx, h.subs[name])
			row.Charts = buildCharts(h.history.samples(name, now), now)
			subs = append(subs, row)
		}
	}
	d := pageData{Caller: caller, Token: h.csrfToken(caller), Subscribers: subs, SampleEvery: h.cfg.sampleEvery, ChartSpan: h.chartSpan(now), Notice: notice, Failure: failure}
	if name := q.Get("subscriber"); name != "" {
		s, ok := h.subs[name]
		switch {
		case !ok:
			status, d.Failure = http.StatusNotFound, "Unknown subscriber "+name+"."
		case !h.readable(r, name):
			// A form's action was allowed but reading is not: the
			// outcome is shown, the subscriber's parked events are not.
		default:
			d.Selected = name
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

// uiAction serves the page's replay, discard, pause and resume forms:
// authorization, the cross-site checks and the anti-CSRF token, then
// Post/Redirect/Get on success, or the page with the failure (and its
// status) otherwise.
func (h *Handler) uiAction(action Action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		name, id := r.PostFormValue("subscriber"), r.PostFormValue("event_id")
		caller, ref := h.authorize(r, action, name)
		if ref == nil {
			if ref = h.sameOrigin(r); ref == nil && !h.validToken(caller, r.PostFormValue("csrf")) {
				ref = &refusal{http.StatusForbidden, "missing or invalid anti-CSRF token (reload the page)"}
			}
			if ref != nil {
				h.cfg.logger.Warn("admin request refused", "reason", ref.reason, "action", string(action), "caller", caller,
					"subscriber", name, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
			}
		}
		if ref != nil {
			http.Error(w, ref.reason, ref.status)
			return
		}
		s, ok := h.subs[name]
		if !ok {
			h.renderPage(w, r, caller, http.StatusNotFound, "", "Unknown subscriber "+name+".")
			return
		}
		var err error
		status := http.StatusOK
		switch action {
		case Replay:
			status, err = h.replayOne(r, s, caller, id)
		case Discard:
			// The form's checkbox is required by the browser; a request
			// without it (a misfired script, an old page) changes nothing.
			if r.PostFormValue("confirm") != "yes" {
				h.renderPage(w, r, caller, http.StatusBadRequest, "", "Not discarded: tick \"sure\" next to Discard to confirm.")
				return
			}
			var p subscriptions.ParkedEvent
			p, err = s.DiscardParked(r.Context(), id, caller)
			h.audit(r, caller, Discard, s.Name(), err, "event_id", id, "event_type", p.EventType, "position", p.Position, "parked_error", p.Error)
			if err != nil {
				status = errorStatus(err, false)
			}
		case Pause:
			// As a discard's: the pause stops the name in every process.
			if r.PostFormValue("confirm") != "yes" {
				h.renderPage(w, r, caller, http.StatusBadRequest, "", "Not paused: tick \"sure\" next to Pause to confirm.")
				return
			}
			_, status, err = h.setPaused(r, s, caller, true, r.PostFormValue("reason"))
		case Resume:
			_, status, err = h.setPaused(r, s, caller, false, "")
		}
		if err != nil {
			h.renderPage(w, r, caller, status, "", err.Error())
			return
		}
		done := map[Action]string{Replay: "replayed", Discard: "discarded", Pause: "paused", Resume: "resumed"}[action]
		// Relative on purpose: http.Redirect would resolve it against the
		// path below the mount prefix.
		w.Header().Set("Location", "../?"+(url.Values{"subscriber": {name}, "done": {done}}).Encode())
		w.WriteHeader(http.StatusSeeOther)
	}
}
