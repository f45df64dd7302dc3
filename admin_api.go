package subscriptions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/eventfeed/subscriptions/domain"
)

// adminMaxBody caps a request body: the API's bodies are a few fields.
const adminMaxBody = 64 << 10

func (h *adminHandler) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", h.servePage)
	m.HandleFunc("POST /ui/replay", h.uiAction(AdminReplay))
	m.HandleFunc("POST /ui/discard", h.uiAction(AdminDiscard))

	m.HandleFunc("GET /api/subscribers", h.apiSubscribers)
	m.HandleFunc("GET /api/subscribers/{name}", h.api(AdminRead, h.apiSubscriber))
	m.HandleFunc("GET /api/subscribers/{name}/parked", h.api(AdminRead, h.apiParkedList))
	m.HandleFunc("GET /api/subscribers/{name}/parked/{id}", h.api(AdminRead, h.apiParkedShow))
	m.HandleFunc("POST /api/subscribers/{name}/parked/{id}/replay", h.api(AdminReplay, h.apiReplayOne))
	m.HandleFunc("DELETE /api/subscribers/{name}/parked/{id}", h.api(AdminDiscard, h.apiDiscard))
	m.HandleFunc("POST /api/subscribers/{name}/replay", h.api(AdminReplay, h.apiReplayMatching))
	m.HandleFunc("POST /api/subscribers/{name}/reset", h.api(AdminReset, h.apiReset))
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

// adminError is the JSON body of every API error.
type adminError struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client went away: nothing to do
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, adminError{Error: msg})
}

// apiFunc is an API endpoint past authorization and CSRF checks.
type apiFunc func(w http.ResponseWriter, r *http.Request, s *Subscriber, caller string)

// api wraps an endpoint about one subscriber: 404 for an unknown name,
// authorization, and for actions the cross-site and content-type checks.
func (h *adminHandler) api(action AdminAction, f apiFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		caller, ref := h.authorize(r, action, name)
		if ref != nil {
			writeJSONError(w, ref.status, ref.reason)
			return
		}
		if action != AdminRead {
			if ref := h.sameOrigin(r); ref != nil {
				h.refused(w, r, caller, action, name, ref)
				return
			}
			if ref := jsonBody(r); ref != nil {
				h.refused(w, r, caller, action, name, ref)
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, adminMaxBody)
		}
		s, ok := h.subs[name]
		if !ok {
			writeJSONError(w, http.StatusNotFound, "unknown subscriber "+strconv.Quote(name))
			return
		}
		if action == AdminRead {
			h.cfg.logger.Debug("admin read", "caller", caller, "subscriber", name, "path", r.URL.Path, "remote", r.RemoteAddr)
		}
		f(w, r, s, caller)
	}
}

func (h *adminHandler) refused(w http.ResponseWriter, r *http.Request, caller string, action AdminAction, name string, ref *adminRefusal) {
	h.cfg.logger.Warn("admin request refused", "reason", ref.reason, "action", string(action), "caller", caller,
		"subscriber", name, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
	writeJSONError(w, ref.status, ref.reason)
}

// errorStatus maps a Subscriber error to an HTTP status. replay tells a
// replay (where "not parked" is a conflict with the request) from a read.
func errorStatus(err error, replay bool) int {
	switch {
	case errors.Is(err, ErrReplayInProgress):
		return http.StatusConflict
	case errors.Is(err, ErrEventNotParked) && replay, errors.Is(err, ErrParkedAfterCheckpoint):
		return http.StatusConflict
	case errors.Is(err, ErrEventNotParked), errors.Is(err, domain.ErrEventNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrNoParkingLot), errors.Is(err, ErrParkingLotNotManaged):
		return http.StatusConflict
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func (h *adminHandler) apiSubscribers(w http.ResponseWriter, r *http.Request) {
	if _, ref := h.authorize(r, AdminRead, ""); ref != nil {
		writeJSONError(w, ref.status, ref.reason)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"subscribers": h.statuses(r.Context())})
}

func (h *adminHandler) apiSubscriber(w http.ResponseWriter, r *http.Request, s *Subscriber, _ string) {
	writeJSON(w, http.StatusOK, adminSubscriberStatus(r.Context(), s))
}

// parkedFilter reads a ParkedFilter from the query string; a malformed
// number is a 400.
func parkedFilter(r *http.Request) (ParkedFilter, error) {
	q := r.URL.Query()
	f := ParkedFilter{EventType: q.Get("event_type"), AggregateID: q.Get("aggregate_id"), Limit: 100}
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

func (h *adminHandler) apiParkedList(w http.ResponseWriter, r *http.Request, s *Subscriber, _ string) {
	f, err := parkedFilter(r)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	page, err := s.ListParkedPage(r.Context(), f)
	if err != nil {
		writeJSONError(w, errorStatus(err, false), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// adminEvent is the stored event shown beside a parked entry.
type adminEvent struct {
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

// adminParkedDetail is one parked event with its stored event (nil, with
// EventError, when the store no longer has it).
type adminParkedDetail struct {
	Parked     ParkedEvent `json:"parked"`
	Event      *adminEvent `json:"event"`
	EventError string      `json:"event_error,omitempty"`
}

func (h *adminHandler) parkedDetail(ctx context.Context, s *Subscriber, id string) (adminParkedDetail, error) {
	p, err := s.GetParked(ctx, id)
	if err != nil {
		return adminParkedDetail{}, err
	}
	d := adminParkedDetail{Parked: p}
	ev, err := s.events.GetEventByID(ctx, id)
	if err != nil {
		d.EventError = err.Error()
		return d, nil
	}
	d.Event = h.eventView(ev)
	return d, nil
}

func (h *adminHandler) eventView(ev domain.EventEnvelope[any]) *adminEvent {
	out := &adminEvent{ID: ev.ID, Type: ev.EventType, Position: ev.Position, AggregateID: ev.AggregateID,
		SequenceNo: ev.SequenceNo, Created: ev.Created, Payload: ev.Payload, Metadata: ev.Metadata}
	if h.cfg.redact {
		out.Payload, out.Metadata, out.Redacted = "[redacted]", nil, true
	}
	return out
}

func (h *adminHandler) apiParkedShow(w http.ResponseWriter, r *http.Request, s *Subscriber, _ string) {
	d, err := h.parkedDetail(r.Context(), s, r.PathValue("id"))
	if err != nil {
		writeJSONError(w, errorStatus(err, false), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// replayOne replays one parked event under the subscriber's replay lock,
// with an audit line; status is the HTTP status of the outcome.
func (h *adminHandler) replayOne(r *http.Request, s *Subscriber, caller, id string) (status int, err error) {
	unlock, ok := h.replayLock(s.name)
	if !ok {
		err = fmt.Errorf("subscriptions: replay event %q for %q: another replay of this subscriber is running: %w", id, s.name, ErrReplayInProgress)
		h.audit(r, caller, AdminReplay, s.name, err, "event_id", id)
		return http.StatusConflict, err
	}
	defer unlock()
	err = s.ReplayParked(r.Context(), id)
	h.audit(r, caller, AdminReplay, s.name, err, "event_id", id)
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

func (h *adminHandler) apiReplayOne(w http.ResponseWriter, r *http.Request, s *Subscriber, caller string) {
	id := r.PathValue("id")
	if status, err := h.replayOne(r, s, caller, id); err != nil {
		writeJSONError(w, status, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"replayed": id})
}

// adminReplayRequest is the body of POST .../replay.
type adminReplayRequest struct {
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

func (h *adminHandler) apiReplayMatching(w http.ResponseWriter, r *http.Request, s *Subscriber, caller string) {
	var req adminReplayRequest
	if err := decodeBody(r, &req); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	unlock, ok := h.replayLock(s.name)
	if !ok {
		writeJSONError(w, http.StatusConflict, "a replay of "+strconv.Quote(s.name)+" is already in progress")
		return
	}
	defer unlock()
	f := ParkedFilter{EventType: req.EventType, AggregateID: req.AggregateID, Limit: req.Limit}
	res, err := s.ReplayParkedMatching(r.Context(), f, req.ContinueOnError)
	h.audit(r, caller, AdminReplay, s.name, err, "filter_event_type", f.EventType, "filter_aggregate_id", f.AggregateID,
		"continue_on_error", req.ContinueOnError, "replayed", len(res.Replayed), "failed", len(res.Failed))
	status := http.StatusOK
	if err != nil {
		if status = errorStatus(err, true); status == http.StatusInternalServerError && len(res.Failed) > 0 {
			status = http.StatusUnprocessableEntity
		}
	}
	writeJSON(w, status, res)
}

func (h *adminHandler) apiDiscard(w http.ResponseWriter, r *http.Request, s *Subscriber, caller string) {
	id := r.PathValue("id")
	p, err := s.DiscardParked(r.Context(), id, caller)
	h.audit(r, caller, AdminDiscard, s.name, err, "event_id", id, "event_type", p.EventType, "position", p.Position, "parked_error", p.Error)
	if err != nil {
		writeJSONError(w, errorStatus(err, false), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"discarded": p})
}

// adminResetRequest is the body of POST .../reset.
type adminResetRequest struct {
	Position *int64 `json:"position"`
}

func (h *adminHandler) apiReset(w http.ResponseWriter, r *http.Request, s *Subscriber, caller string) {
	var req adminResetRequest
	if err := decodeBody(r, &req); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.Position == nil || *req.Position < 0 {
		writeJSONError(w, http.StatusBadRequest, `position: want {"position": N} with N >= 0`)
		return
	}
	// A checkpoint past the head would skip every event appended until the
	// feed gets there (Status then reports ErrCheckpointAhead): refused.
	head, err := s.events.HeadPosition(r.Context())
	if err != nil {
		err = fmt.Errorf("subscriptions: reset of %q: read the feed head: %w", s.name, err)
		h.audit(r, caller, AdminReset, s.name, err, "position", *req.Position)
		writeJSONError(w, errorStatus(err, false), err.Error())
		return
	}
	if *req.Position > head {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("position: %d is beyond the feed head %d (the subscriber would skip the events appended until the feed reaches it); nothing was changed", *req.Position, head))
		return
	}
	err = s.ResetCheckpoint(r.Context(), *req.Position)
	h.audit(r, caller, AdminReset, s.name, err, "position", *req.Position)
	if err != nil {
		writeJSONError(w, errorStatus(err, false), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"subscriber": s.name, "position": *req.Position})
}
