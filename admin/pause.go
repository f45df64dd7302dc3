package admin

import (
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

// pauseState is the answer to a pause or a resume: the name's pause as
// Status reads it once the action returned (a second pause keeps the
// first, whose time and reason it shows; a resume by another operator
// in between shows as not paused).
type pauseState struct {
	Subscriber string    `json:"subscriber"`
	Paused     bool      `json:"paused"`
	PausedAt   time.Time `json:"paused_at,omitzero"`
	Reason     string    `json:"reason,omitempty"`
}

// setPaused is the pause (or resume) of both the API and the page:
// Subscriber.Pause with reason (every replica and partition of the name,
// in every process, from its next batch on) or Subscriber.Resume, with
// an audit line, then the pause read back. status is the HTTP status of a
// failure. It runs on the request's goroutine; Pause returns once the
// name's batch in flight, if any, has ended.
func (h *Handler) setPaused(r *http.Request, s *subscriptions.Subscriber, caller string, pause bool, reason string) (st pauseState, status int, err error) {
	action, attrs := Resume, []any{}
	if pause {
		action, attrs = Pause, []any{"reason", reason}
		err = s.Pause(r.Context(), reason)
	} else {
		err = s.Resume(r.Context())
	}
	h.audit(r, caller, action, s.Name(), err, attrs...)
	if err != nil {
		return st, errorStatus(err, false), err
	}
	read, err := s.Status(r.Context())
	if err != nil && !errors.Is(err, subscriptions.ErrCheckpointAhead) {
		return st, http.StatusInternalServerError, fmt.Errorf("the %s of %q is done, but reading it back failed: %w", action, s.Name(), err)
	}
	return pauseState{Subscriber: s.Name(), Paused: read.Paused, PausedAt: read.PausedAt, Reason: read.PauseReason}, http.StatusOK, nil
}

func (h *Handler) apiPause(w http.ResponseWriter, r *http.Request, s *subscriptions.Subscriber, caller string) {
	var req pauseRequest
	if err := decodeBody(r, &req); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	h.writePaused(w, r, s, caller, true, req.Reason)
}

// apiResume takes no body (one is ignored), as a replay of one event.
func (h *Handler) apiResume(w http.ResponseWriter, r *http.Request, s *subscriptions.Subscriber, caller string) {
	h.writePaused(w, r, s, caller, false, "")
}

func (h *Handler) writePaused(w http.ResponseWriter, r *http.Request, s *subscriptions.Subscriber, caller string, pause bool, reason string) {
	st, status, err := h.setPaused(r, s, caller, pause, reason)
	if err != nil {
		writeJSONError(w, status, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, st)
}
