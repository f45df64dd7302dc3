package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/eventfeed/subscriptions"
)

// pauseRequest is the body of POST .../pause.
type pauseRequest struct {
	Reason string `json:"reason"`
}

// PauseState is a subscriber's pause as both admin surfaces (the
// handler's pause and resume, cmd/subscriptions' pause and resume) answer
// it, read by ReadPause: whether the name is paused everywhere, since when
// and why (Status.Paused, PausedAt, PauseReason).
type PauseState struct {
	Subscriber string `json:"subscriber"`
	// Tenant is the tenant of a Group's subscriber (Status.Tenant), or
	// the schema the CLI was given; "" otherwise.
	Tenant   string    `json:"tenant,omitempty"`
	Paused   bool      `json:"paused"`
	PausedAt time.Time `json:"paused_at,omitzero"`
	Reason   string    `json:"reason,omitempty"`
}

// ReadPause reads s's pause through Subscriber.Status, as both surfaces
// do once a pause or resume returned (a second pause keeps the first,
// whose time and reason it then shows; a resume by another operator in
// between shows as not paused). A checkpoint ahead of the head does not
// keep it from being read. It changes nothing; safe for concurrent use.
func ReadPause(ctx context.Context, s *subscriptions.Subscriber) (PauseState, error) {
	st, err := s.Status(ctx)
	if err != nil && !errors.Is(err, subscriptions.ErrCheckpointAhead) {
		return PauseState{}, fmt.Errorf("admin: read the pause of %q: %w", s.Name(), err)
	}
	return PauseState{Subscriber: s.Name(), Tenant: st.Tenant, Paused: st.Paused, PausedAt: st.PausedAt, Reason: st.PauseReason}, nil
}

// setPaused is the pause (or resume) of both the API and the page:
// Subscriber.Pause with reason (every replica and partition of the name,
// in every process, from its next batch on) or Subscriber.Resume, with
// an audit line, then the pause read back (ReadPause). status is the
// HTTP status of a failure. It runs on the request's goroutine; Pause
// returns once the name's batch in flight, if any, has ended.
func (h *Handler) setPaused(r *http.Request, t target, caller string, pause bool, reason string) (st PauseState, status int, err error) {
	action, attrs := Resume, []any{}
	if pause {
		action, attrs = Pause, []any{"reason", reason}
		err = t.s.Pause(r.Context(), reason)
	} else {
		err = t.s.Resume(r.Context())
	}
	h.audit(r, caller, action, t.key, err, attrs...)
	if err != nil {
		return st, errorStatus(err, false), err
	}
	if st, err = ReadPause(r.Context(), t.s); err != nil {
		return st, http.StatusInternalServerError, fmt.Errorf("the %s is done, but: %w", action, err)
	}
	st.Tenant = t.tenant
	return st, http.StatusOK, nil
}

func (h *Handler) apiPause(w http.ResponseWriter, r *http.Request, t target, caller string) {
	var req pauseRequest
	if err := decodeBody(r, &req); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	h.writePaused(w, r, t, caller, true, req.Reason)
}

// apiResume takes no body (one is ignored), as a replay of one event.
func (h *Handler) apiResume(w http.ResponseWriter, r *http.Request, t target, caller string) {
	h.writePaused(w, r, t, caller, false, "")
}

func (h *Handler) writePaused(w http.ResponseWriter, r *http.Request, t target, caller string, pause bool, reason string) {
	st, status, err := h.setPaused(r, t, caller, pause, reason)
	if err != nil {
		writeJSONError(w, status, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, st)
}
