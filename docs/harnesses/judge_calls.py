"""The judge's HTTP calls as the harness drivers record and report them. Plain Python, so that it runs in either
harness's venv (the drivers import it from their own directory)."""

import json


def short(text, width=70):
    return repr(text if len(text) <= width else text[:width] + "...")


class CallLog:
    """Every HTTP exchange of a judge client: the fields it sent, the status and the answer it got."""

    def __init__(self):
        self.calls = []
        self.step = None  # the dataset or task being judged

    def record(self, body, status, text: str):
        sent = json.loads(body) if body else {}
        call = {"step": self.step, "model": sent.get("model"), "temperature": sent.get("temperature"),
                "max_tokens": sent.get("max_tokens", sent.get("max_completion_tokens")), "status": status,
                "format": (sent.get("response_format") or {}).get("type")}
        if status == 200:
            call["answer"] = json.loads(text)["choices"][0]["message"]["content"]
        else:
            call["error"] = text
        self.calls.append(call)

    def report(self, steps, problems: list) -> int:
        """Prints every call and a summary; 1 when a call was not answered 200 or the driver found problems."""
        print("\n== every HTTP call the judge client made")
        width = max(len(step) for step in steps)
        for call in self.calls:
            outcome = short(call["answer"]) if call["status"] == 200 else short(call["error"], 200)
            structured = f" response_format={call['format']}" if call["format"] else ""
            print(f"{call['step']:<{width}} model={call['model']} temperature={call['temperature']} "
                  f"max_tokens={call['max_tokens']}{structured} -> {call['status']} {outcome}")
        refused = [call for call in self.calls if call["status"] != 200]
        temperatures = {step: sorted({call["temperature"] for call in self.calls if call["step"] == step})
                        for step in steps}
        print(f"\n== summary: {len(self.calls)} HTTP calls, {len(self.calls) - len(refused)} answered 200, "
              f"{len(refused)} not; temperatures sent: {temperatures}")
        if refused:
            problems = [f"{len(refused)} calls not answered 200", *problems]
        if not self.calls:
            problems = ["no call reached the judge", *problems]
        print("FAILED: " + "; ".join(problems) if problems else "OK: every judge call answered 200, every sample judged")
        return 1 if problems else 0


def observed_requests(send, log: CallLog):
    """requests.Session.send, recording each exchange in `log`."""

    def observed_send(session, request, **kwargs):
        try:
            response = send(session, request, **kwargs)
        except Exception as error:
            log.record(request.body, None, f"{type(error).__name__}: {error}")
            raise
        log.record(request.body, response.status_code, response.text)
        return response

    return observed_send
