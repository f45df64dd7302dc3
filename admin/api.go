package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/eventfeed/subscriptions"
	"github.com/eventfeed/subscriptions/domain"
)

// maxBody caps a request body: the API's bodies are a few fields.
const maxBody = 64 << 10

func (h *Handler) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", h.servePage)
	m.HandleFunc("POST /ui/replay", h.uiAction(Replay))
	m.HandleFunc("POST /ui/discard", h.uiAction(Discard))
	m.HandleFunc("POST /ui/pause", h.uiAction(Pause))
	m.HandleFunc("POST /ui/resume", h.uiAction(Resume))

	m.HandleFunc("GET /api/subscribers", h.apiSubscribers)
	m.HandleFunc("GET /api/subscribers/{name}", h.api(Read, h.apiSubscriber))
	m.HandleFunc("GET /api/subscribers/{name}/parked", h.api(Read, h.apiParkedList))
	m.HandleFunc("GET /api/subscribers/{name}/parked/{id}", h.api(Read, h.apiParkedShow))
	m.HandleFunc("POST /api/subscribers/{name}/parked/{id}/replay", h.api(Replay, h.apiReplayOne))
	m.HandleFunc("DELETE /api/subscribers/{name}/parked/{id}", h.api(Discard, h.apiDiscard))
	m.HandleFunc("POST /api/subscribers/{name}/replay", h.api(Replay, h.apiReplayMatching))
	m.HandleFunc("POST /api/subscribers/{name}/reset", h.api(Reset, h.apiReset))
	m.HandleFunc("POST /api/subscribers/{name}/pause", h.api(Pause, h.apiPause))
	m.HandleFunc("POST /api/subscribers/{name}/resume", h.api(Resume, h.apiResume))
	m.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		// Reached when no route has this method and path: tell a wrong
		// method (405) from a wrong path (404), in JSON.
		var allow []string
		for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
			probe := r.Clone(r.Context())
			probe.Method = method
			if _, pattern := m.Handler(probe); pattern != "/api/" {
				allow = append(allow, method)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeJSONError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed here (allowed: "+strings.Join(allow, ", ")+")")
			return
		}
		writeJSONError(w, http.StatusNotFound, "no such API route: "+r.Method+" "+r.URL.Path)
	})
	h.mux = m
}

// apiError is the JSON body of every API error.
type apiError struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client went away: nothing to do
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Error: msg})
}

// target is the subscriber a request is about: its row and Subscriber.
type target struct {
	key
	s *subscriptions.Subscriber
}

// apiFunc is an API endpoint past authorization and CSRF checks.
type apiFunc func(w http.ResponseWriter, r *http.Request, t target, caller string)

// api wraps an endpoint about one subscriber, {name} and ?tenant=
// (NewGroupHandler's): authorization, for actions the cross-site and
// content-type checks, then 404 for an unknown name or tenant (400
// without the tenant a group's subscriber needs).
func (h *Handler) api(action Action, f apiFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		k := key{tenant: r.URL.Query().Get("tenant"), name: r.PathValue("name")}
		caller, ref := h.authorize(r, action, k)
		if ref != nil {
			writeJSONError(w, ref.status, ref.reason)
			return
		}
		if action != Read {
			if ref := h.sameOrigin(r); ref != nil {
				h.refused(w, r, caller, action, k, ref)
				return
			}
			if ref := jsonBody(r); ref != nil {
				h.refused(w, r, caller, action, k, ref)
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		}
		s, ref := h.src.lookup(k)
		if ref != nil {
			writeJSONError(w, ref.status, ref.reason)
			return
		}
		if action == Read {
			h.cfg.logger.Debug("admin read", append(append([]any{"caller", caller}, k.logAttrs()...), "path", r.URL.Path, "remote", r.RemoteAddr)...)
		}
		f(w, r, target{k, s}, caller)
	}
}

func (h *Handler) refused(w http.ResponseWriter, r *http.Request, caller string, action Action, k key, ref *refusal) {
	h.logRefusal(r, caller, action, k, ref)
	writeJSONError(w, ref.status, ref.reason)
}

// errorStatus maps a Subscriber error to an HTTP status. replay tells a
// replay (where "not parked" is a conflict with the request) from a read.
func errorStatus(err error, replay bool) int {
	switch {
	case errors.Is(err, subscriptions.ErrReplayInProgress):
		return http.StatusConflict
	case errors.Is(err, subscriptions.ErrEventNotParked) && replay, errors.Is(err, subscriptions.ErrParkedAfterCheckpoint),
		errors.Is(err, subscriptions.ErrParkedBehindHead):
		return http.StatusConflict
	case errors.Is(err, subscriptions.ErrEventNotParked), errors.Is(err, domain.ErrEventNotFound):
		return http.StatusNotFound
	case errors.Is(err, subscriptions.ErrNoParkingLot), errors.Is(err, subscriptions.ErrParkingLotNotManaged),
		errors.Is(err, subscriptions.ErrPauseUnsupported), errors.Is(err, subscriptions.ErrPartitionsChanged):
		return http.StatusConflict
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// apiSubscribers lists every row, or with ?tenant=T (repeatable) the rows
// of those tenants: the authorizer is asked about the list (tenant "",
// subscriber "") or about each tenant's (T, "").
func (h *Handler) apiSubscribers(w http.ResponseWriter, r *http.Request) {
	tenants := tenantFilter(r)
	lists := []key{{}}
	if len(tenants) > 0 {
		lists = lists[:0]
		for _, t := range tenants {
			lists = append(lists, key{tenant: t})
		}
	}
	for _, k := range lists {
		if _, ref := h.authorize(r, Read, k); ref != nil {
			writeJSONError(w, ref.status, ref.reason)
			return
		}
	}
	keys, ref := h.filterKeys(tenants)
	if ref != nil {
		writeJSONError(w, ref.status, ref.reason)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"subscribers": h.statuses(r.Context(), keys)})
}

// tenantFilter is the request's ?tenant= values, empty ones left out.
func tenantFilter(r *http.Request) []string {
	var out []string
	for _, t := range r.URL.Query()["tenant"] {
		if t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

func (h *Handler) apiSubscriber(w http.ResponseWriter, r *http.Request, t target, _ string) {
	writeJSON(w, http.StatusOK, readStatus(r.Context(), t))
}

// parkedFilter reads a ParkedFilter from the query string; a malformed
// number is a 400.
func parkedFilter(r *http.Request) (subscriptions.ParkedFilter, error) {
	q := r.URL.Query()
	f := subscriptions.ParkedFilter{EventType: q.Get("event_type"), AggregateID: q.Get("aggregate_id"), Limit: 100}
	var err error
	if v := q.Get("after"); v != "" {
		if f.AfterPosition, err = strconv.ParseInt(v, 10, 64); err != nil {
			return f, errors.New("after: not a position: " + strconv.Quote(v))
		}
	}
	if v := q.Get("limit"); v != "" {
		if f.Limit, err = strconv.Atoi(v); err != nil || f.Limit < 1 || f.Limit > 1000 {
			return f, errors.New("limit: want 1 to 1000, got " + strconv.Quote(v))
		}
	}
	return f, nil
}

func (h *Handler) apiParkedList(w http.ResponseWriter, r *http.Request, t target, _ string) {
	f, err := parkedFilter(r)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	page, err := t.s.ListParkedPage(r.Context(), f)
	if err != nil {
		writeJSONError(w, errorStatus(err, false), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// storedEvent is the stored event shown beside a parked entry.
type storedEvent struct {
	ID          string         `json:"id"`
	Type        string         `json:"type"`
	Position    int64          `json:"position"`
	AggregateID string         `json:"aggregate_id"`
	SequenceNo  int            `json:"sequence_no"`
	Created     time.Time      `json:"created"`
	Payload     any            `json:"payload"`
	Metadata    map[string]any `json:"metadata,omitempty"`
	Redacted    bool           `json:"redacted,omitempty"`
}

// parkedDetail is one parked event with its stored event (nil, with
// EventError, when the store no longer has it).
type parkedDetail struct {
	Parked     subscriptions.ParkedEvent `json:"parked"`
	Event      *storedEvent              `json:"event"`
	EventError string                    `json:"event_error,omitempty"`
}

func (h *Handler) detail(ctx context.Context, s *subscriptions.Subscriber, id string) (parkedDetail, error) {
	p, err := s.GetParked(ctx, id)
	if err != nil {
		return parkedDetail{}, err
	}
	d := parkedDetail{Parked: p}
	ev, err := s.Event(ctx, id)
	if err != nil {
		d.EventError = err.Error()
		return d, nil
	}
	d.Event = h.eventView(ev)
	return d, nil
}

func (h *Handler) eventView(ev domain.EventEnvelope[any]) *storedEvent {
	out := &storedEvent{ID: ev.ID, Type: ev.EventType, Position: ev.Position, AggregateID: ev.AggregateID,
		SequenceNo: ev.SequenceNo, Created: ev.Created, Payload: ev.Payload, Metadata: ev.Metadata}
	if h.cfg.redact {
		out.Payload, out.Metadata, out.Redacted = "[redacted]", nil, true
	}
	return out
}

func (h *Handler) apiParkedShow(w http.ResponseWriter, r *http.Request, t target, _ string) {
	d, err := h.detail(r.Context(), t.s, r.PathValue("id"))
	if err != nil {
		writeJSONError(w, errorStatus(err, false), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// replayOne replays one parked event under the subscriber's replay lock,
// with an audit line; status is the HTTP status of the outcome.
func (h *Handler) replayOne(r *http.Request, t target, caller, id string) (status int, err error) {
	unlock, ok := h.replayLock(t.key)
	if !ok {
		err = fmt.Errorf("subscriptions: replay event %q for %q: another replay of this subscriber is running: %w", id, t.name, subscriptions.ErrReplayInProgress)
		h.audit(r, caller, Replay, t.key, err, "event_id", id)
		return http.StatusConflict, err
	}
	defer unlock()
	err = t.s.ReplayParked(r.Context(), id)
	h.audit(r, caller, Replay, t.key, err, "event_id", id)
	switch {
	case err == nil:
		return http.StatusOK, nil
	case errorStatus(err, true) != http.StatusInternalServerError:
		return errorStatus(err, true), err
	}
	// The handler (or the store) failed: the event stays parked with the
	// failure recorded.
	return http.StatusUnprocessableEntity, err
}

func (h *Handler) apiReplayOne(w http.ResponseWriter, r *http.Request, t target, caller string) {
	id := r.PathValue("id")
	if status, err := h.replayOne(r, t, caller, id); err != nil {
		writeJSONError(w, status, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"replayed": id})
}

// replayRequest is the body of POST .../replay.
type replayRequest struct {
	EventType       string `json:"event_type"`
	AggregateID     string `json:"aggregate_id"`
	ContinueOnError bool   `json:"continue_on_error"`
	Limit           int    `json:"limit"`
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errors.New("request body: " + err.Error())
	}
	return nil
}

func (h *Handler) apiReplayMatching(w http.ResponseWriter, r *http.Request, t target, caller string) {
	var req replayRequest
	if err := decodeBody(r, &req); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	unlock, ok := h.replayLock(t.key)
	if !ok {
		writeJSONError(w, http.StatusConflict, "a replay of "+strconv.Quote(t.name)+" is already in progress")
		return
	}
	defer unlock()
	f := subscriptions.ParkedFilter{EventType: req.EventType, AggregateID: req.AggregateID, Limit: req.Limit}
	res, err := t.s.ReplayParkedMatching(r.Context(), f, req.ContinueOnError)
	h.audit(r, caller, Replay, t.key, err, "filter_event_type", f.EventType, "filter_aggregate_id", f.AggregateID,
		"continue_on_error", req.ContinueOnError, "replayed", len(res.Replayed), "failed", len(res.Failed))
	status := http.StatusOK
	if err != nil {
		if status = errorStatus(err, true); status == http.StatusInternalServerError && len(res.Failed) > 0 {
			status = http.StatusUnprocessableEntity
		}
	}
	writeJSON(w, status, res)
}

func (h *Handler) apiDiscard(w http.ResponseWriter, r *http.Request, t target, caller string) {
	id := r.PathValue("id")
	p, err := t.s.DiscardParked(r.Context(), id, caller)
	h.audit(r, caller, Discard, t.key, err, "event_id", id, "event_type", p.EventType, "position", p.Position, "parked_error", p.Error)
	if err != nil {
		writeJSONError(w, errorStatus(err, false), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"discarded": p})
}

// resetRequest is the body of POST .../reset.
type resetRequest struct {
	Position *int64 `json:"position"`
}

func (h *Handler) apiReset(w http.ResponseWriter, r *http.Request, t target, caller string) {
	var req resetRequest
	if err := decodeBody(r, &req); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.Position == nil || *req.Position < 0 {
		writeJSONError(w, http.StatusBadRequest, `position: want {"position": N} with N >= 0`)
		return
	}
	var beyond *BeyondHeadError
	err := CheckReset(r.Context(), t.s, *req.Position)
	switch {
	case errors.As(err, &beyond):
		writeJSONError(w, http.StatusBadRequest, "position: "+err.Error())
		return
	case err != nil:
		h.audit(r, caller, Reset, t.key, err, "position", *req.Position)
		writeJSONError(w, errorStatus(err, false), err.Error())
		return
	}
	err = t.s.ResetCheckpoint(r.Context(), *req.Position)
	h.audit(r, caller, Reset, t.key, err, "position", *req.Position)
	if err != nil {
		writeJSONError(w, errorStatus(err, false), err.Error())
		return
	}
	out := map[string]any{"subscriber": t.name, "position": *req.Position}
	if t.tenant != "" {
		out["tenant"] = t.tenant
	}
	writeJSON(w, http.StatusOK, out)
}
